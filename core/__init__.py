"""The base: config, storage, the run layout, records, the model card, progress.

Every library (tasks, alignment, training, decoding, serving) and the app (amflow/)
imports from here; nothing here imports a library or the app.
"""
