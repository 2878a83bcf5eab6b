"""`ray job submit --working-dir . -- python jobs/bigLSTM.py [--preset tiny|paper] ...`:
jobs/train.py with the model fixed to biglstm (see orchestrator/pipeline.py)."""

import sys
from pathlib import Path

# Under `ray job submit --working-dir .` the project is the working directory, not an
# installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.pipeline import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main("biglstm", sys.argv[1:], prog="jobs/bigLSTM.py"))
