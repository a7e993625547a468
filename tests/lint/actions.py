"""Prepares the repository's GitHub Actions files for the linters
(tests/workflows.rs runs it with the lint tools' Python, which has ruamel.yaml):

    actions.py ROOT OUT

- OUT/action-as-workflow.yml: the composite action (ROOT/action.yml) as a
  reusable workflow whose inputs are the action's, so that actionlint checks
  its steps, their expressions and their shell scripts (through shellcheck)
  as it checks a workflow's.
- OUT/example-*.yml: each GitHub Actions workflow in the yaml blocks of
  ROOT/README.md and ROOT/docs/check.md, for actionlint; a step there that uses this action (`*/cupool@*`)
  must give every required input and only inputs the action has.

Prints one line per problem and exits 1 when there is any.
"""

import io
import re
import sys
from pathlib import Path

from ruamel.yaml import YAML

root, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
yaml = YAML()
problems = []

action = yaml.load((root / "action.yml").read_text())
if action.get("runs", {}).get("using") != "composite":
    problems.append("action.yml: runs.using is not composite")
inputs = action.get("inputs") or {}
for i, step in enumerate(action["runs"].get("steps") or []):
    if "run" in step and "shell" not in step:
        problems.append(f"action.yml: step {i} ({step.get('name')}) runs a script without a shell, which a composite action needs")
workflow = {
    "name": "action.yml as a workflow",
    "on": {
        "workflow_call": {
            "inputs": {
                name: {
                    "type": "string",
                    "required": bool(spec.get("required", False)),
                    **({"default": str(spec["default"])} if "default" in spec else {}),
                }
                for name, spec in inputs.items()
            }
        }
    },
    "jobs": {"action": {"runs-on": "ubuntu-latest", "steps": action["runs"]["steps"]}},
}
buf = io.StringIO()
yaml.dump(workflow, buf)
(out / "action-as-workflow.yml").write_text(buf.getvalue())

# The step outputs the action's outputs name exist.
ids = {s.get("id") for s in action["runs"]["steps"]}
for name, spec in (action.get("outputs") or {}).items():
    for step_id in re.findall(r"steps\.([A-Za-z0-9_-]+)\.outputs", str(spec.get("value", ""))):
        if step_id not in ids:
            problems.append(f"action.yml: output {name} names step {step_id!r}, which the action does not have")

uses_action = 0
blocks = [
    (f"{name}", n, block)
    for name in ("README.md", "docs/check.md")
    for n, block in enumerate(re.findall(r"```yaml\n(.*?)```", (root / name).read_text(), re.S))
]
for name, n, block in blocks:
    doc = yaml.load(block)
    if not isinstance(doc, dict) or "jobs" not in doc:
        continue  # not a GitHub Actions workflow
    (out / f"example-{name.replace('/', '-')}-{n}.yml").write_text(block)
    for job in doc["jobs"].values():
        for step in job.get("steps") or []:
            uses = str(step.get("uses", ""))
            if not re.search(r"/cupool@", uses):
                continue
            uses_action += 1
            given = set((step.get("with") or {}).keys())
            for unknown in sorted(given - set(inputs)):
                problems.append(f"{name}: {uses} is given {unknown!r}, which action.yml does not take")
            for input_name, spec in inputs.items():
                if spec.get("required") and input_name not in given:
                    problems.append(f"{name}: {uses} lacks the required input {input_name!r}")
if uses_action == 0:
    problems.append("README.md: no workflow example uses the action (OWNER/cupool@...)")

for p in problems:
    print(p)
sys.exit(1 if problems else 0)
