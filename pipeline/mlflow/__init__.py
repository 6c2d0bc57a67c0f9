"""Mirror of published versions in an MLflow tracking server and model registry.

``mirror`` (``pipeline.mlflow.mirror``) turns offmeta versions into MLflow runs and registered
model versions whose model is ``pipeline.mlflow.pyfunc_model.OffmetaPolicy``; the offmeta store
stays the source of truth. Only these modules import mlflow (the ``offmeta[mlflow]`` extra).
"""
