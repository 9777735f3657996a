"""Trial tool nodes: launch, watch, stop and collect trials. All side effects on trials live here."""
