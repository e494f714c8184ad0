"""The reconcile loop: runtime (queue, workers, timers), the job reconciler and pure policies."""
