# Source this on the GPU machine, from the repository root, with .whl carried:
#   source tools/device/install.sh && falconet plugins list
# Installs the wheels prepared by tools/device/prepare.sh without a network, into /tmp/site
# (the machine's own torch and libraries stay as they are), and puts them on the paths.
python3 -m pip install --quiet --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl || return 1
export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
export PATH="/tmp/site/bin:$PATH"
