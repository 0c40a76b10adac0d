# Sourced at the start of a device call (scripts/device_paper.sh does): the device image has torch but neither
# mdmkit installed nor hydra-core/omegaconf/antlr4, so the wheels carried in .whl/ go to /tmp/site (on
# PYTHONPATH), and the uninstalled checkout's config package is conf/ itself. Sets PYTHON (python3 by default) and
# MDMKIT_CACHE_DIR (runs/cache).
#   device run: source scripts/device_env.sh && $PYTHON scripts/bench_train_step.py ...     carry: [.whl]
PYTHON=${PYTHON:-python3}
# the data cache in the checkout: a warm machine keeps it for the next call
export PYTHON PYTHONUNBUFFERED=1 MDMKIT_CACHE_DIR=${MDMKIT_CACHE_DIR:-runs/cache}
if compgen -G ".whl/*.whl" > /dev/null; then
    "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} || return 1
fi
"$PYTHON" -c "import mdmkit.conf" 2> /dev/null || ln -sfn ../conf mdmkit/conf
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
return 0
