"""The pytest plugin :func:`labkit.teaching.notebooks.nbval_command` loads first (``-p``: before the installed
plugins, and nbval imports nbformat at its own import), so the nbval run's process goes without the IRI grammar
(:func:`labkit.teaching.notebooks.skip_iri_grammar`). Course tooling behind ``make test``, taught in no chapter."""
from labkit.teaching.notebooks import skip_iri_grammar

skip_iri_grammar()
