"""The node agent: starting runs under the run wrapper, process groups, exits, logs.

Pure OS work, no store: `process` (spawn, exit record, reap), `identity`
(pid + start time), `groups` (signals to a run's process group), `watcher`
(pidfd-based exit notifications), `logs` (reading, tail and follow), `logtrim`
(keeping live runs' logs within their limit). Submodules are not
imported here so that `import reconciler.agent` stays cheap for the CLI.
"""
