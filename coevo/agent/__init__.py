"""The harness runtime: a harness + skills + rubric + backend turned into scored trajectories.

context.py builds the one token sequence an episode is trained on, graph.py runs the harness
workflow as a LangGraph graph, tools.py executes the harness's own tools (calculator.py: the
calculator's killable worker; coevo/sandbox.py isolates `python`), skills.py picks the
skills shown, episode.py runs many episodes concurrently through a DynamicBatcher.
"""

from coevo.agent.episode import run_episode, run_episodes, run_episodes_sync, sample_seed

__all__ = ["run_episode", "run_episodes", "run_episodes_sync", "sample_seed"]
