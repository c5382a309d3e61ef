#!/usr/bin/env bash
# Check lbbsp against one TensorFlow release, as a user with that release installs it.
#
#   bash scripts/compat.sh 2.21.0            # TensorFlow 2.21 (with tf-keras 2.21 and TF_USE_LEGACY_KERAS=1)
#   PYTHON=python3.12 bash scripts/compat.sh 2.21.0
#
# In a fresh virtual environment (.compat/tf-VERSION-pyX.Y): tensorflow-cpu==VERSION (and tf-keras of the same
# minor version from 2.16 on), Horovod 0.28.1 built against it (scripts/build_horovod.sh), then `pip install`
# of this checkout, with `pip freeze` compared before and after (lbbsp must change no installed package);
# where Keras 3 is TensorFlow's default, `import lbbsp.keras` without TF_USE_LEGACY_KERAS must stop with the
# fix named; then the Keras tests and the horovodrun tests. Prints one line for the README's compatibility
# table and writes it to the environment's result.txt.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tf="${1:?usage: compat.sh TENSORFLOW_VERSION}"
python="${PYTHON:-python3.11}"
started=$(date +%s)
pyver="$("$python" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
venv="$root/.compat/tf-$tf-py$pyver"
rm -rf "$venv"
"$python" -m venv "$venv"
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip setuptools wheel
minor="$(echo "$tf" | cut -d. -f1,2)"
legacy=0
if [ "$(printf '%s\n2.16\n' "$minor" | sort -V | head -n1)" = 2.16 ]; then legacy=1; fi
if [ "$legacy" = 1 ]; then
  "${pip[@]}" install "tensorflow-cpu==$tf" "tf-keras==$minor.*"
else
  "${pip[@]}" install "tensorflow-cpu==$tf"
fi
bash "$root/scripts/build_horovod.sh" "$py"
"${pip[@]}" install pytest
"$py" -m pip freeze --exclude-editable | sort > "$venv/freeze-before.txt"
"${pip[@]}" install "$root"
"$py" -m pip freeze --exclude-editable | sort > "$venv/freeze-after.txt"
changed="$(diff "$venv/freeze-before.txt" "$venv/freeze-after.txt" | grep '^[<>]' | grep -v '^> lbbsp[ =@]' || true)"
keras3="n/a"
if [ "$legacy" = 1 ]; then
  refusal="$(cd /tmp && TF_CPP_MIN_LOG_LEVEL=3 "$py" -c "import lbbsp.keras" 2>&1 || true)"
  if grep -q "TF_USE_LEGACY_KERAS=1" <<< "$refusal"; then
    keras3="refused with the fix"
  else
    keras3="NOT refused"
  fi
  export TF_USE_LEGACY_KERAS=1
fi
log="$venv/tests.log"
set +e
(cd "$root" && OMP_NUM_THREADS=1 TF_CPP_MIN_LOG_LEVEL=2 "$py" -m pytest -q -p no:cacheprovider \
    tests/test_keras.py tests/test_multiprocess.py) > "$log" 2>&1
status=$?
set -e
summary="$(grep -E '[0-9]+ (passed|failed)' "$log" | tail -n1)"
versions="$("$py" -c 'import importlib.metadata as m
keras = "tf-keras " + m.version("tf-keras") if m.packages_distributions().get("tf_keras") else "tf.keras"
print("numpy %s, horovod %s, %s" % (m.version("numpy"), m.version("horovod"), keras))' 2>/dev/null || echo "versions unknown")"
line="| $tf | $pyver | $versions | $summary | ${changed:-none} | $keras3 | $(( $(date +%s) - started )) s |"
echo "$line" | tee "$venv/result.txt"
exit $status
