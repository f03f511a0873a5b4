// What the GPU benchmarks stamp their results with, shared by the bench_*.cu programs.
#pragma once

#include <string>
#include <vector>

#include "attention/head_roles.h"
#include "attention/decode_spec.h"
#include "model/config.h"

namespace lychee::bench {

// "CUDA driver API 13.0; NVRM version: ..." (the kernel module's line when /proc has it).
std::string driver_string();

// "1,4,16" -> {1, 4, 16}: a comma-separated list of integers (a command line's sizes or counts);
// std::invalid_argument naming the item for one that is not an integer.
std::vector<long long> parse_numbers(const std::string& s);

// "full,lychee" -> {"full", "lychee"}: a comma-separated list of names ("" -> none).
std::vector<std::string> parse_names(const std::string& s);

// Lowers the log level to info (where it is higher): what the engine reports of its choices, such
// as the prefill's autotuned cuDNN plans, reaches stderr (a .cu file cannot include core/log.h:
// fmt's constexpr code under nvcc).
void show_info_logs();

// The retrieval heads LycheeDecode and DuoAttention get in the benchmarks: layer 0's and a seeded
// draw, n_retrieval clamped to [n_kv_heads, all KV heads].
HeadRoles bench_roles(const ModelConfig& c, int n_retrieval);

// The benchmarks' policy by name (full, lychee, tidal, quest, duo) at a budget of `budget` tokens
// per head: LycheeDecode top-k with bench_roles and `block_size`, TidalDecode's default selection
// layers, Quest's pages of 16, each with 2 dense layers, DuoAttention's sink of 64 and the rest
// recent. std::runtime_error for another name.
DecodeSpec bench_policy(const std::string& name, const ModelConfig& c, int budget, int n_retrieval, int block_size);

}  // namespace lychee::bench
