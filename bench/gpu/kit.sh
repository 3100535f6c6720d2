# Sourced by the bench/gpu/*.sh runs on the device machine: vLLM from ../shared/gpu-vllm's kit
# (carried to /tmp/w, installed to /tmp/site) and the wheels in .whl2, with NVLink multicast off
# for every process (the device notes, KINDS.md, say to leave it off). Here, after prepare.sh, once:
# `bash bench/gpu/kit_fit.sh`, which lays the kit's folders out again to fit beside this tree.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
eval "$(bash .gpu/tools/install.sh)"
if [ ! -d /tmp/site/pydantic_settings ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl2/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD
# install.sh's exports set these too; again, so that no process here runs without them.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
