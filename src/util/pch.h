// Precompiled header: the libtorch headers almost every translation unit needs.
// Parsing torch/torch.h costs ~20 s per file on this machine; through the PCH it is paid once.
#pragma once
#include <torch/torch.h>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>
#include <memory>
