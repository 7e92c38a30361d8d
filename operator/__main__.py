"""`python -m pagoda.operator` runs the operator (same as `pagoda-operator`)."""

import sys

from pagoda.operator.main import main

sys.exit(main())
