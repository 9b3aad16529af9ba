"""Build the native extension ``qkernels._C``.

CPU/OpenMP kernels (csrc/cpu) are always built; CUDA kernels (csrc/cuda) too when the installed
torch has CUDA and nvcc is found. ``QKERNELS_NO_EXT=1`` skips native code entirely (the pure
PyTorch reference backend still works). A failing compile fails the install, never first use.
"""

import glob
import os
import shutil
import sys

from setuptools import setup

if os.environ.get("QKERNELS_NO_EXT", "0") == "1":
    setup()
else:
    import torch
    from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

    here = os.path.dirname(os.path.abspath(__file__))
    sources = sorted(glob.glob("csrc/*.cpp") + glob.glob("csrc/cpu/*.cpp"))
    nvcc = shutil.which("nvcc") or (CUDA_HOME and os.path.join(CUDA_HOME, "bin", "nvcc"))
    with_cuda = (
        torch.version.cuda is not None
        and nvcc is not None
        and os.path.exists(nvcc)
        and os.environ.get("QKERNELS_NO_CUDA", "0") != "1"
    )
    cxx_flags = ["-O3", "-fopenmp"]
    # Link the C++ runtime as the shared libstdc++.so.6 torch itself uses. A compiler wrapper that
    # puts a directory holding only libstdc++.a first on the search path (the CUDA image of
    # shared/gpu/h200-2026-11-26.md: CXX=/opt/gcc/bin/g++ -B...) otherwise links a private static
    # copy into _C.so whose iostreams use the system library's locale tables: formatting any number
    # in an error message (every TORCH_CHECK with a size) then segfaults instead of raising.
    link_flags = ["-fopenmp"] + (["-l:libstdc++.so.6"] if sys.platform.startswith("linux") else [])
    define_macros = []
    if with_cuda:
        sources += sorted(glob.glob("csrc/cuda/*.cu") + glob.glob("csrc/cuda/*.cpp"))
        define_macros.append(("QKERNELS_WITH_CUDA", "1"))
        extension = CUDAExtension
    else:
        extension = CppExtension
    ext = extension(
        "qkernels._C",
        sources,
        include_dirs=[os.path.join(here, "csrc", "include")],
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags, "nvcc": ["-O3"]},
        extra_link_args=link_flags,
    )
    setup(ext_modules=[ext], cmdclass={"build_ext": BuildExtension})
