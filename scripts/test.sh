#!/usr/bin/env bash
# Builds, then runs the whole test suite (CTest: oracle, cpu backend, validation, README example),
# then the Python package's tests (pytest, tests/python) against the module in build/. Both suites
# run even when the first fails. The last line of the output counts both suites' tests:
# "N passed, N failed, N skipped" (skipped: GPU tests without a GPU, tests whose framework is not
# installed). The exit status is non-zero when anything failed.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
python="${MLA_PYTHON:-$root/.deps/venv/bin/python}"
# NOTE: tests on explicitly: a build/ configured without them (a bench-only build) would otherwise
# leave CTest nothing to run, which must fail, not pass.
bash "$root/scripts/build.sh" -DMLA_BUILD_TESTS=ON
reports="$root/build/test-reports"
rm -rf "$reports"
mkdir -p "$reports"

ctest_status=0
(cd "$root/build" &&
  ctest --output-on-failure --no-tests=error -j "$(nproc)" --output-junit "$reports/ctest.xml") ||
  ctest_status=$?
pytest_status=0
(cd "$root" &&
  MLA_DECODE_LIBRARY="$root/build/libmla_decode_ffi.so" \
    PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" \
    "$python" -m pytest tests/python -q --junitxml="$reports/pytest.xml") ||
  pytest_status=$?

# The closing count, from both suites' JUnit reports. A suite that exited non-zero without a failed
# test in its report (no report written, no tests found, a crash) counts as one failure.
"$python" - "$reports/ctest.xml" "$ctest_status" "$reports/pytest.xml" "$pytest_status" <<'EOF'
import sys
import xml.etree.ElementTree as ET


def count(path, status):
    passed = failed = skipped = 0
    try:
        cases = ET.parse(path).getroot().iter("testcase")
    except (OSError, ET.ParseError) as e:
        print(f"{path}: no report ({e})", file=sys.stderr)
        cases = []
    for case in cases:
        # CTest: status run, fail, notrun (with <skipped>: skipped itself; without: could not
        # start) or disabled. pytest: <failure>/<error>, <skipped> (skips and xfails), or neither.
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
        elif case.find("skipped") is not None or case.get("status") == "disabled":
            skipped += 1
        elif case.get("status", "run") == "run":
            passed += 1
        else:
            failed += 1
    if status != 0 and failed == 0:
        print(f"{path}: the suite exited with status {status} and no failed test", file=sys.stderr)
        failed = 1
    return passed, failed, skipped


args = sys.argv[1:]
totals = [0, 0, 0]
for name, (path, status) in zip(("ctest", "pytest"), zip(args[0::2], args[1::2])):
    counts = count(path, int(status))
    print(f"{name}: {counts[0]} passed, {counts[1]} failed, {counts[2]} skipped")
    totals = [t + c for t, c in zip(totals, counts)]
print(f"{totals[0]} passed, {totals[1]} failed, {totals[2]} skipped")
sys.exit(1 if totals[1] else 0)
EOF
