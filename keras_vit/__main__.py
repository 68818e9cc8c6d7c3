import os
import sys

from keras_vit.cli import main
from keras_vit.training import jax_job

if os.environ.get(jax_job.CHILD):  # a JAX job's training process (`jax_job.supervise`)
    jax_job.run_child(main)
sys.exit(main())
