"""verl's config key prefixes, one home for every module that builds or reads a verl key (the backends' knob
catalogues, the simulator, the job model, the stages). Keys are verl's flat Hydra keys
(``actor_rollout_ref.rollout.n``): https://verl.readthedocs.io/en/latest/examples/config.html"""

from __future__ import annotations

#: the worker group of actor, rollout and reference policy
ARR = "actor_rollout_ref"
ACTOR = f"{ARR}.actor."
ROLLOUT = f"{ARR}.rollout."
REF = f"{ARR}.ref."
MODEL = f"{ARR}.model."
#: the actor's learning rate (stage 2's main knob)
LR_KEY = f"{ACTOR}optim.lr"
