"""`ray job submit --working-dir . -- python jobs/train.py --model MODEL [...]`: profile,
plan, project, sweep and train any model end to end (see orchestrator/pipeline.py).
MODEL is biglstm, gnmt, inception_v3, vgg16 or MODULE:FUNCTION of a model of your own
(in the working directory, or shipped with --py-modules)."""

import sys
from pathlib import Path

# Under `ray job submit --working-dir .` the project is the working directory, not an
# installed package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from orchestrator.pipeline import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(argv=sys.argv[1:]))
