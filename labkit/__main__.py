import sys

from labkit.teaching.notebooks import skip_iri_grammar

skip_iri_grammar()                  # before any command imports nbformat
from labkit.cli import main  # noqa: E402

sys.exit(main())
