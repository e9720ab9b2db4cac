"""coevo: model-harness co-evolution.

An agent is a model (weights) + a harness (prompt, tools, workflow, demos) + a skill library +
the rubrics that reward it. coevo alternates an RL stage on the weights with LLM-proposed
revisions of the other three, accepting a revision only when a paired validation gate shows it
helps, and stores every version, proposal, decision and checkpoint in SQL.
"""

__version__ = "0.1.0"
