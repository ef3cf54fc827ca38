"""The one TVM adapter, target profiles, the numbered build pipeline, the artefact cache."""
