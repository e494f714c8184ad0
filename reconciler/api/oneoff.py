"""A one-off job described without a manifest: `reconciler run`'s options, or the seed's job
request (`POST /jobs`, a Source's message), as the Job spec they stand for."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


@dataclass
class OneOff:
    """A job described on the command line (`reconciler run`), Jobman-style."""

    command: list[str]
    name: str | None = None
    shell: bool = False  # run the words as one string through /bin/sh -c
    after_success: list[str] = field(default_factory=list)
    after_finish: list[str] = field(default_factory=list)
    pool: str | None = None
    slots: int = 1
    retries: int = 0
    retry_delay: str | None = None
    retryable_exit_codes: list[int] = field(default_factory=list)
    timeout: str | None = None
    run_timeout: str | None = None
    wait_file: str | None = None
    working_dir: str | None = field(default_factory=os.getcwd)  # None: the run's own folder (an artifact's)
    # what the seed's job request (POST /jobs) also says
    env: dict[str, str] = field(default_factory=dict)
    job_type: str = "run"
    port: int | None = None
    node_name: str | None = None
    artifact_url: str | None = None

    def spec(self) -> dict[str, Any]:
        spec: dict[str, Any] = {"shell": " ".join(self.command)} if self.shell else {"command": list(self.command)}
        spec["slots"] = self.slots
        if self.working_dir is not None:
            spec["workingDir"] = self.working_dir
        spec.update(_stated(self.env, self.job_type, self.port, self.node_name, self.artifact_url))
        deps = [{"job": j, "outcomes": ["Succeeded"]} for j in self.after_success]
        deps += [{"job": j, "outcomes": ["Finished"]} for j in self.after_finish]
        if deps:
            spec["dependsOn"] = deps
        if self.pool:
            spec["pool"] = self.pool
        retry: dict[str, Any] = {"limit": self.retries}
        if self.retry_delay:
            retry["backoff"] = {"policy": "constant", "delay": self.retry_delay}
        if self.retryable_exit_codes:
            retry["onExitCodes"] = self.retryable_exit_codes
        spec["retry"] = retry
        if self.timeout:
            spec["timeout"] = self.timeout
        if self.run_timeout:
            spec["runTimeout"] = self.run_timeout
        if self.wait_file:
            spec["waitFor"] = {"conditions": [{"path": os.path.abspath(self.wait_file)}]}
        return spec


class JobRequest(BaseModel):
    """The seed's job request; fields it does not know are ignored, as the seed's decoder did.

    `command` is one string run by /bin/sh -c (the seed ran it so), `deploy_url` the job's
    artifact, `job_type` its type, `port`, `env_vars` its environment, `instance_id` the node
    it is pinned to."""

    model_config = ConfigDict(extra="ignore")
    command: str = ""
    deploy_url: str = ""
    job_type: Literal["run", "service"] = "run"
    port: int | None = Field(default=None, description="service only")
    env_vars: dict[str, str] = Field(default_factory=dict)
    instance_id: str = Field(default="", description="the node to run on")

    def problem(self) -> str | None:
        """Why the request makes no job, naming the field; None when it does."""
        if self.command:
            return None
        if self.deploy_url:
            return "command: required (deploy_url only gives the files the command runs in)"
        return "command: required (or deploy_url with a command)"

    def spec(self) -> dict[str, Any]:
        """The Job spec fields the request states, and no default: what a Source merges its
        template under. A job_type the request spells out is stated even when it is "run",
        the default: it wins over a template's `type: service`."""
        spec = {
            "shell": self.command,
            **_stated(self.env_vars, self.job_type, self.port, self.instance_id, self.deploy_url),
        }
        if "job_type" in self.model_fields_set:
            spec["type"] = self.job_type
        return spec

    def one_off(self, working_dir: str) -> OneOff:
        """The job; it runs in `working_dir`, or, with a deploy_url, in its unpacked files
        (the artifact's folder is the run's working directory, API.md 1.1)."""
        return OneOff(
            command=[self.command],
            shell=True,
            working_dir=None if self.deploy_url else working_dir,
            env=self.env_vars,
            job_type=self.job_type,
            port=self.port,
            node_name=self.instance_id or None,
            artifact_url=self.deploy_url or None,
        )


def _stated(
    env: dict[str, str], job_type: str, port: int | None, node_name: str | None, artifact_url: str | None
) -> dict[str, Any]:
    """The spec fields of what a request or `run` says besides its command."""
    spec: dict[str, Any] = {}
    if env:
        spec["env"] = dict(env)
    if job_type != "run":
        spec["type"] = job_type
    if port is not None:
        spec["port"] = port
    if node_name:
        spec["placement"] = {"nodeName": node_name}
    if artifact_url:
        spec["artifact"] = {"url": artifact_url}
    return spec
