# Sourced at the start of a device call (tools/device/device_paper.sh does): the device image has torch but neither
# mdmkit installed nor some of its dependencies, so the wheels carried in .whl/ (made here by
# tools/device/device_wheels.sh) go to /tmp/site (on PYTHONPATH), and the uninstalled checkout's config package is
# conf/ itself. Stops in one line, before any work, where a module is still missing. Sets PYTHON (python3 by
# default), MDMKIT_CACHE_DIR (runs/cache) and TRAINED (runs/trained: the models device_paper.sh trained here).
#   device run: source tools/device/device_env.sh && $PYTHON -m benchmarks.bench_train_step ...     carry: [.whl]
PYTHON=${PYTHON:-python3}
# the data cache and the trained models in the ignored runs/: a warm machine keeps them for the next call
export PYTHON PYTHONUNBUFFERED=1 MDMKIT_CACHE_DIR=${MDMKIT_CACHE_DIR:-runs/cache} TRAINED=${TRAINED:-runs/trained}
WHEELS=${WHEELS:-.whl}  # the device's Python's wheels: tests on this machine point it elsewhere
if compgen -G "$WHEELS/*.whl" > /dev/null; then
    rm -rf /tmp/site  # exactly these wheels: a package left by an earlier call on a warm machine could break imports
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$WHEELS"/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} || return 1
fi
"$PYTHON" -c "import mdmkit.conf" 2> /dev/null || ln -sfn ../conf mdmkit/conf
missing=$("$PYTHON" - <<'PY'
import importlib
for name in ("hydra", "omegaconf", "datasets", "lightning", "mdmkit.conf"):
    try:
        importlib.import_module(name)
    except Exception as error:  # an ImportError, or a version check failing inside an import
        print(f"{name} ({type(error).__name__}: {str(error).splitlines()[0][:160]})")
PY
)
if [ -n "$missing" ]; then
    echo "device_env.sh: cannot import $(echo "$missing" | paste -sd ';' -): run tools/device/device_wheels.sh here and carry .whl" >&2
    return 1
fi
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
return 0
