"""What the commands share: the environment each sets, how a refusal is printed, the check that a spec's
packages are installed, and the lines that describe a run."""
from __future__ import annotations

import sys
from typing import List

import specs

# privzo runs offline: no usage telemetry from the libraries it drives. `privzo run` with no Prefect server
# starts Prefect's temporary one, whose 20 s start-up allowance is too short on a busy laptop or a 2-core CI
# box (the first run then fails before any work): 120 s. Set by the command, before Prefect or MLflow is
# imported; a team's worker has them from its stack (infra/local-stack.sh, infra/compose/Dockerfile).
COMMAND_ENVIRONMENT = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
}


# insecure_deterministic: the epsilon a spec names is nominal, and every output that shows it says so
INSECURE = ("NOT private (privacy.insecure_deterministic: noise and batches come from the public seed; "
            "the nominal epsilon does not hold)")


def fail(message: str, code: int = 2) -> int:
    """A command's refusal: its one line on stderr, and the exit status (2: the input; 130: interrupted)."""
    print(f"privzo: error: {message}", file=sys.stderr)
    return code


def missing_packages(spec) -> List[str]:
    """One line for each package the run would load a named dataset, model or adapter from and that is not
    installed (found without importing anything)."""
    from components.data_check import package_missing
    from components.pretrained import PRETRAINED  # no torch
    sources = [("data.source", spec.data.source)]
    if spec.data.split.kind == "source":
        sources.append(("data.split.public_source", spec.data.split.public_source))
    parts = [(source.name, f"{field}.name") for field, source in sources if source.kind in ("text", "packaged_images")]
    parts += [(source.tokenizer, f"{field}.tokenizer") for field, source in sources
              if source.kind == "text" and source.tokenizer in PRETRAINED]
    model = spec.model
    if model.kind == "hf":
        parts.append(("hf", "model.kind"))
        if model.name is not None:
            parts.append((model.name, "model.name"))
        if model.trainable == "lora":
            parts.append(("lora", "model.trainable"))
    return [line for line in (package_missing(*part) for part in dict.fromkeys(parts)) if line]


def installed_spec(path) -> "specs.RunSpec":
    """The spec at ``path``, refused in one line when a package its data, model or adapter comes from is not
    installed (before Prefect or MLflow start)."""
    spec = specs.load_spec(path)
    missing = missing_packages(spec)
    if missing:
        raise specs.SpecError("; ".join(missing))
    return spec


def summary_line(name: str, result: dict) -> str:
    """The run's headline in the metrics its evaluation returned (``eval/*``): a classifier's test accuracy
    and loss; a synthetic objective's excess risk, with O2NC's Goldstein certificate or a KL problem's
    gradient norm, and the test loss where the problem has test rows (flows.sweep.METRICS names them)."""
    if "eval/accuracy" in result:
        return f"{name}: test accuracy {result['eval/accuracy']:.4f}, test loss {result['eval/loss']:.4f}"
    from flows.sweep import METRICS, headline

    evaluated = {k.split("/", 1)[1]: v for k, v in result.items() if k.startswith("eval/")}
    # 4 significant digits, not 4 decimals: an excess risk near the noise floor is far below 1e-4
    parts = [f"{METRICS[m].label} {evaluated[m]:.4g}" for m in headline(evaluated)]
    if "loss" in evaluated:
        parts.append(f"test loss {evaluated['loss']:.4g}")
    if not parts:  # a metric no row of METRICS names yet: show what was evaluated rather than nothing
        parts = [f"{k} {v:.4g}" for k, v in evaluated.items()]
    return f"{name}: " + ", ".join(parts)


def say_over_declared(spec: specs.RunSpec) -> None:
    """Blocks of the file over their declared size, on stderr of the data holder's own command (never in the
    run's logs or MLflow: the count is private)."""
    if spec.data.blocks is None:
        return
    from components.builders import source_table
    from flows.window import over_declared

    for line in over_declared(spec, source_table(spec)):
        print(line, file=sys.stderr)
