"""A JAX training job across processes, described by Keras' `KERAS_DISTRIBUTION_*` variables.

`keras.distribution.initialize()` reads the same three variables; `start()` checks them first,
so that a missing or inconsistent one is refused in one line before anything is built, then
starts JAX's distributed runtime with CPU collectives over gloo (which JAX needs for CPU devices
across processes) and a heartbeat short enough for a dead process to be noticed in seconds.

A process whose peer dies is stopped by JAX's runtime itself (a native abort, no Python
exception): `keras-vit train` runs such a job in a child process and reports that end in one
line (`supervise`).
"""

import dataclasses
import os
import re

ADDRESSES = "KERAS_DISTRIBUTION_JOB_ADDRESSES"
NUM_PROCESSES = "KERAS_DISTRIBUTION_NUM_PROCESSES"
PROCESS_ID = "KERAS_DISTRIBUTION_PROCESS_ID"
VARIABLES = (ADDRESSES, NUM_PROCESSES, PROCESS_ID)

# Seconds a process may go silent before the job's coordinator declares it dead (JAX's default:
# 100). A surviving process then stops within about this long.
HEARTBEAT_SECONDS = 10
# Seconds the processes wait for each other to start.
START_TIMEOUT_SECONDS = 300
# What JAX's runtime writes when it ends a process because another one died, and what a
# collective over gloo raises when its peer's connection drops.
PEER_LOST = (
    "JAX distributed service detected fatal errors",
    "Failed to send RPC to coordination service",
    "Connection reset by peer",
    "Connection closed by peer",
)

_ADDRESS = re.compile(r"^[\w.\-]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$")


@dataclasses.dataclass(frozen=True)
class Job:
    coordinator: str  # host:port of process 0
    num_processes: int
    process_id: int


def described(environ=os.environ):
    """Whether the environment describes a job (any of the variables is set)."""
    return any(environ.get(name) for name in VARIABLES)


def read(environ=os.environ):
    """The `Job` the variables describe.

    Raises:
        ValueError: a variable missing, not a number, out of range, or addresses that disagree
            with the process count.
    """
    missing = [name for name in VARIABLES if not environ.get(name, "").strip()]
    if missing:
        raise ValueError(
            f"--strategy multi-worker on JAX starts from {', '.join(VARIABLES)}; "
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set (e.g. "
            f"{ADDRESSES}=10.0.0.1:1234 {NUM_PROCESSES}=2 {PROCESS_ID}=0 on the first machine)."
        )
    count, index = _whole(environ, NUM_PROCESSES), _whole(environ, PROCESS_ID)
    if count < 1:
        raise ValueError(f"{NUM_PROCESSES} must be at least 1, got {count}.")
    if not 0 <= index < count:
        raise ValueError(f"{PROCESS_ID} must be from 0 to {NUM_PROCESSES} - 1 = {count - 1}, got {index}.")
    addresses = [a.strip() for a in environ[ADDRESSES].split(",")]
    bad = [a for a in addresses if not _ADDRESS.match(a)]
    if bad:
        raise ValueError(f"{ADDRESSES} takes host:port addresses, got {', '.join(map(repr, bad))}.")
    if len(addresses) > 1 and len(addresses) != count:
        raise ValueError(
            f"{ADDRESSES} lists {len(addresses)} addresses and {NUM_PROCESSES} is {count}: give "
            f"process 0's address alone, or one per process."
        )
    return Job(coordinator=addresses[0], num_processes=count, process_id=index)


def start(environ=os.environ):
    """Checks the variables and starts JAX's distributed runtime; returns the `Job`."""
    import jax

    job = read(environ)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(
        coordinator_address=job.coordinator,
        num_processes=job.num_processes,
        process_id=job.process_id,
        initialization_timeout=START_TIMEOUT_SECONDS,
        heartbeat_timeout_seconds=HEARTBEAT_SECONDS,
    )
    return job


def _whole(environ, name):
    try:
        return int(environ[name])
    except ValueError:
        raise ValueError(f"{name} must be a whole number, got {environ[name]!r}.") from None


# Set in the child `supervise` starts: the process that trains.
CHILD = "KERAS_VIT_JOB_CHILD"
# Native log lines (glog's "E1125 17:21:18.303 ...", its stack frames and check failures): the
# runtime's own account of an abort, kept in the job's log file instead of the terminal.
_NATIVE = re.compile(
    r"^([IWEF]\d{4} |\s+@\s+0x|\*\*\* |WARNING: All log messages|\[Gloo\] "
    r"|Additional GRPC error information|:UNKNOWN:|RPC: )"  # gRPC's account of a lost coordinator
)


def supervise(argv, verbose=False):
    """Runs `keras-vit train ARGV` as this process's child and returns its exit status, so that a
    job whose runtime aborts ends in one line. The child's output passes through as it comes,
    but for native log lines and tracebacks: those go to a log file named in that one line.
    The child dies with this process (Linux's parent-death signal)."""
    import signal
    import subprocess
    import sys
    import tempfile

    job = read()
    log = tempfile.NamedTemporaryFile(
        "w", prefix=f"keras-vit-train-process{job.process_id}-", suffix=".log", delete=False
    )
    child = subprocess.Popen(
        [sys.executable, "-m", "keras_vit", "train", *argv],
        env={**os.environ, CHILD: "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,  # one stream, in order; gloo writes to standard output
        text=True,
        bufsize=1,
        preexec_fn=_die_with_parent,
    )
    held = []  # a traceback's lines, until it ends
    with log:
        for line in child.stdout:
            log.write(line)
            if verbose:
                sys.stdout.write(line)
            elif held or line.startswith("Traceback (most recent call last)"):
                held.append(line)
            elif line.startswith("keras-vit "):
                sys.stderr.write(line)  # its one-line error
            elif not _NATIVE.match(line):
                sys.stdout.write(line)
            sys.stdout.flush()
        status = child.wait()
    if status == 0:
        os.remove(log.name)
        return 0
    with open(log.name) as f:
        output = f.read()
    if any(sign in output for sign in PEER_LOST):
        what = "another process of the job stopped, or process 0 cannot be reached"
    elif status < 0:
        what = f"the training process was ended by {signal.Signals(-status).name}"
    elif held:
        what = f"the training process failed: {held[-1].strip()}"
    else:
        return status  # it said why itself, in one line
    print(
        f"keras-vit train: error: process {job.process_id} of {job.num_processes} stopped: {what}. "
        f"Start every process again with the same command: the run resumes from its last backup "
        f"(this process's log: {log.name}).",
        file=sys.stderr,
    )
    return 1


def run_child(main):
    """Runs `main()` as a job's training process and exits with its status. One that failed
    leaves at once: JAX's exit hook would wait at the runtime's shutdown barrier (five minutes)
    for the other processes, stuck in a collective that waits for this one; gone, it is noticed
    by their heartbeat in seconds."""
    import sys
    import traceback

    try:
        status = main()
    except SystemExit as end:  # as Python ends: None is 0, a message is printed and 1
        status = end.code if isinstance(end.code, int) else 0 if end.code is None else 1
        if not isinstance(end.code, int | None):
            print(end.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - the parent turns it into one line (`supervise`)
        traceback.print_exc()
        status = 1
    if status:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(0)


def _die_with_parent():
    import ctypes
    import signal

    PR_SET_PDEATHSIG = 1
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
