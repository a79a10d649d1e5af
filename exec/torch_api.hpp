// The parts of LibTorch the executor uses: tensors and their operators, autograd (custom
// functions included), AdamW, serialization and the CUDA queries. Not <torch/torch.h>: its nn,
// data and JIT front ends are unused here, and leaving them out makes every torch translation
// unit compile in about 0.7 of the time (exec/runtime.cpp 25 s against 36 s with torch 2.11 at
// -g1 on this project's build machine; the precompiled header 54 s against 75 s).
#pragma once

#include <torch/autograd.h>
#include <torch/cuda.h>
#include <torch/optim/adamw.h>
#include <torch/serialize.h>
#include <torch/types.h>
#include <torch/utils.h>
