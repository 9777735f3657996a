"""The agents' name for ``mart.nodes.knob_effects`` (what mart knows about a knob, read off its catalogue record):
the module lives one level up so that a stage policy (``mart.nodes.stages``) can read a knob's facts too without
an import circle between the stages and the agents."""

from mart.nodes.knob_effects import FACTS, KnobEffect, effect_of, knob_facts, reference_record

__all__ = ["FACTS", "KnobEffect", "effect_of", "knob_facts", "reference_record"]
