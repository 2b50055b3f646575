"""A RUN step's command in its build pod (both builders): a login shell through the pod's
daemon, its output into the build log."""

from __future__ import annotations

from services.builder.builds import BuildLog, Commands, State, StepFailed
from shared.errors import EnvdError, EnvdUnavailable
from shared.models.snapshots import ProcessConfig
from shared.ports.workloads import Endpoint


async def run_step(
    commands: Commands,
    endpoint: Endpoint,
    token: str,
    *,
    number: int,
    command: str,
    user: str,
    state: State,
    out: BuildLog,
    timeout: float,
) -> None:
    """A RUN step's command in its build pod (both runtimes): a login shell as ``user`` through
    the pod's daemon, its output into the build log. The daemon's error, the pod going away or a
    non-zero exit ends the build with that reason (and the exit code, E2B's "exit status N")."""

    async def output(line: str) -> None:
        await out.line(line, step=number)

    shown = command if len(command) <= 200 else command[:200] + "…"
    try:
        code = await commands.run(
            endpoint,
            ProcessConfig(
                cmd="/bin/bash", args=["-l", "-c", command], cwd=state.workdir, envs=state.env
            ),
            user=user,
            access_token=token,
            on_output=output,
            timeout=timeout,
        )
    except EnvdError as e:
        reason = str(e).removeprefix("envd error ")
        raise StepFailed(
            number, f"failed to run command '{shown}': command failed: {reason}"
        ) from e
    except EnvdUnavailable as e:
        raise StepFailed(number, f"failed to run command '{shown}': the build pod went away") from e
    if code != 0:
        raise StepFailed(
            number, f"failed to run command '{shown}': exit status {code}", exit_code=code
        )
