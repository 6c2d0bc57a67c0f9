"""Scale-out: meta-training on ``learners.num_learners`` Ray Train workers.

``train_on_ray`` is the training stage for ``num_learners > 0``; ``worker_cpus`` says how
many CPUs each worker may hold so that Ray Data reads still find free CPUs; a
``WorkerFault`` drills the recovery from a lost worker.
"""

from flows.scale_out.driver import scaling_config, train_on_ray, worker_cpus
from flows.scale_out.worker import WorkerFault
from learners.training.data_parallel import ParametersDivergedError

__all__ = [
    "ParametersDivergedError",
    "WorkerFault",
    "scaling_config",
    "train_on_ray",
    "worker_cpus",
]
