"""Record the real-tool samples with RLlib 2.60 and Minari 0.5 (run by regenerate_real.sh).

This runs in the throwaway virtualenv that regenerate_real.sh creates, never in offmeta's
own environment: it is the only place that imports RLlib or Minari.

- ``rllib_cartpole/``: PPO on CartPole-v1, trained for two short iterations with RLlib's
  offline recorder on (``config.offline_data(output=..., output_write_episodes=False)``):
  the recorder's own files, as it writes them.
- ``rllib_multiagent_cartpole/``: RLlib 2.60 refuses to record multi-agent runs ("Multi-agent
  recording is not supported, yet."). ``_MultiAgentRecorder`` runs RLlib's
  ``MultiAgentEnvRunner`` on MultiAgentCartPole (two agents, two policies) and hands each
  agent's ``SingleAgentEpisode`` to the single-agent recorder's own row mapping and writer,
  so rows look as RLlib would write them, with ``agent_id``/``module_id`` filled.
- ``minari_cartpole/{arrow,parquet,hdf5}/``: Minari's ``DataCollector`` on CartPole-v1 with
  a random policy, one dataset per storage format, copied as ``create_dataset`` writes it.
"""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

_ITERATIONS = 2
_TRAIN_BATCH = 64
_MINARI_EPISODES = 12
_SEED = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--work", type=Path, required=True, help="scratch directory")
    parser.add_argument("--out", type=Path, required=True, help="data/samples directory")
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        _record_rllib(args.work / "rllib", args.out / "rllib_cartpole" / "recording")
        _record_rllib_multi_agent(
            args.work / "rllib_ma", args.out / "rllib_multiagent_cartpole" / "recording"
        )
    finally:
        ray.shutdown()
    for data_format in ("arrow", "parquet", "hdf5"):
        _record_minari(args.work / "minari", data_format, args.out / "minari_cartpole")


def _ppo_config(train_batch: int):
    from ray.rllib.algorithms.ppo import PPOConfig

    return (
        PPOConfig()
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=train_batch, minibatch_size=16, num_epochs=1)
        .debugging(seed=_SEED)
    )


def _offline_output(config, output: Path):
    # Uncompressed columns: the recorder's default LZ4-packs obs/new_obs into opaque bytes.
    return config.offline_data(
        output=f"local://{output}", output_write_episodes=False, output_compress_columns=[]
    )


def _record_rllib(work: Path, out: Path) -> None:
    config = _offline_output(_ppo_config(_TRAIN_BATCH).environment("CartPole-v1"), work)
    algo = config.build_algo()
    for _ in range(_ITERATIONS):
        algo.train()
    algo.stop()
    _replace(out, work)


def _record_rllib_multi_agent(work: Path, out: Path) -> None:
    from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

    config = (
        # Two agents' rows per env step: half the batch keeps the sample under 1 MB.
        _ppo_config(_TRAIN_BATCH // 2)
        .environment(MultiAgentCartPole, env_config={"num_agents": 2})
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda agent_id, episode, **kw: f"p{agent_id}",
        )
        .env_runners(env_runner_cls=_multi_agent_recorder_class())
    )
    config = _offline_output(config, work)
    algo = config.build_algo()
    for _ in range(_ITERATIONS):
        algo.train()
    algo.stop()
    _replace(out, work)


def _multi_agent_recorder_class():
    import ray
    from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
    from ray.rllib.offline.offline_env_runner import OfflineSingleAgentEnvRunner

    class _MultiAgentRecorder(MultiAgentEnvRunner):
        """RLlib's single-agent recorder (row mapping, buffer, one write per ``sample``),
        applied to each agent's episode of a multi-agent run."""

        def __init__(self, *, config, **kwargs):
            super().__init__(config=config, **kwargs)
            self.output_compress_columns = config.output_compress_columns
            self.worker_path = "run-" + f"{self.worker_index}".zfill(6)
            self._sample_counter = 0
            self._samples = []

        def sample(self, **kwargs):
            episodes = super().sample(**kwargs)
            self._sample_counter += 1
            agent_episodes = [e for ma in episodes for e in ma.agent_episodes.values()]
            OfflineSingleAgentEnvRunner._map_episodes_to_data(self, agent_episodes)
            path = Path(self.config.output.removeprefix("local://"))
            run = self.worker_path + f"-{self._sample_counter}".zfill(6)  # as RLlib names it
            target = path / "multiagentcartpole" / run
            ray.data.from_items(self._samples).write_parquet(target.as_posix())
            return episodes

    return _MultiAgentRecorder


def _record_minari(work: Path, data_format: str, out: Path) -> None:
    root = work / data_format
    os.environ["MINARI_DATASETS_PATH"] = str(root)
    import gymnasium as gym
    import minari

    env = minari.DataCollector(gym.make("CartPole-v1"), data_format=data_format)
    env.action_space.seed(_SEED)
    for episode in range(_MINARI_EPISODES):
        env.reset(seed=_SEED + episode)
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
    dataset = env.create_dataset(
        dataset_id="cartpole/random-v0",
        algorithm_name="uniform random actions",
        description="CartPole-v1 with uniformly random actions (offmeta's importer sample).",
        ref_max_score=500.0,
        num_episodes_average_score=10,
    )
    env.close()
    _replace(out / data_format, Path(dataset.spec.data_path).parent)


def _replace(target: Path, source: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source, target)


if __name__ == "__main__":
    main()
