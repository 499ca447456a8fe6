"""The pytest plugin :func:`labkit.teaching.notebooks.nbval_command` loads first (``-p``: before the installed
plugins, and nbval imports nbformat at its own import), so the nbval run's process goes without the IRI grammar
(:func:`labkit.teaching.notebooks.skip_iri_grammar`), and at its end removes the scratch folders of the kernels nbval
killed (nbval stops a kernel with SIGKILL, so no exit handler of the kernel runs: :func:`labkit.paths.sweep_scratch`).
Course tooling behind ``make test``, taught in no chapter."""
from labkit.paths import sweep_scratch
from labkit.teaching.notebooks import skip_iri_grammar

skip_iri_grammar()


def pytest_unconfigure(config) -> None:
    """After the session, its kernels stopped: their scratch folders go."""
    sweep_scratch()
