"""Recipes: named pipelines of runs and steps (configs/recipes/*.yaml), read by `amflow run`
and the Airflow DAGs (definition), run top to bottom in one process (executor)."""
