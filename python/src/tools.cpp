// lychee._lychee: head-role files, head-role training (train/train_heads.h, the CLI's
// train-heads) and a checkpoint's weights as NumPy arrays (the loader the engine uses).
#include <Python.h>

#include <memory>
#include <optional>

#include <nanobind/ndarray.h>
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "attention/head_roles.h"
#include "attention/selection.h"
#include "bindings.h"
#include "core/error.h"
#include "model/weight_table.h"
#include "runtime/engine.h"
#include "train/train_heads.h"

namespace lychee::py {

namespace {

std::vector<std::vector<bool>> role_matrix(const HeadRoles& r) {
  std::vector<std::vector<bool>> m(size_t(r.n_layers), std::vector<bool>(size_t(r.n_kv_heads)));
  for (int l = 0; l < r.n_layers; ++l)
    for (int h = 0; h < r.n_kv_heads; ++h) m[size_t(l)][size_t(h)] = r.is_retrieval(l, h);
  return m;
}

HeadRoles roles_from_matrix(const std::vector<std::vector<bool>>& m) {
  LY_CHECK(!m.empty() && !m[0].empty(), ErrorCode::kInvalidArgument,
           "retrieval: expected a [n_layers][n_kv_heads] matrix with at least one layer and head");
  HeadRoles r;
  r.n_layers = int(m.size());
  r.n_kv_heads = int(m[0].size());
  for (size_t l = 0; l < m.size(); ++l) {
    LY_CHECK(m[l].size() == m[0].size(), ErrorCode::kInvalidArgument,
             "retrieval: row {} has {} KV heads, row 0 has {}", l, m[l].size(), m[0].size());
    for (bool b : m[l]) r.retrieval.push_back(b ? 1 : 0);
  }
  r.model = {{"n_layers", r.n_layers}, {"n_kv_heads", r.n_kv_heads}};
  r.provenance = {{"tool", "lychee (Python)"}};
  return r;
}

// Every weight of the checkpoint at `path` in f32, HF names and layout (Q/K rows un-permuted),
// as NumPy arrays that own their memory.
nb::dict read_weights(const std::string& path) {
  std::unique_ptr<Checkpoint> ck;
  {
    nb::gil_scoped_release release;
    ck = std::make_unique<Checkpoint>(open_checkpoint(path));
  }
  const ModelConfig& c = ck->config();
  nb::dict out;
  for (const WeightSpec& spec : weight_table()) {
    for (int layer = 0; layer < (spec.per_layer ? c.n_layers : 1); ++layer) {
      const RawWeight* w = ck->weight(spec.id, layer);
      if (w == nullptr) continue;
      size_t n = 1;
      for (int64_t d : w->shape) n *= size_t(d);
      float* data = new float[n];
      nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
      {
        nb::gil_scoped_release release;
        ck->read_f32(spec.id, layer, data);
      }
      std::vector<size_t> shape(w->shape.begin(), w->shape.end());
      const std::string name = *spec.hf_name ? weight_hf_name(spec, layer) : weight_gguf_name(spec, layer);
      out[name.c_str()] = nb::ndarray<nb::numpy, float>(data, shape.size(), shape.data(), owner);
    }
  }
  return out;
}

}  // namespace

void bind_roles(nb::module_& m) {
  nb::class_<HeadRoles>(m, "HeadRoles",
                        "A head-role matrix: per (layer, KV head) retrieval (True) or sparse/streaming (False), "
                        "with the model's identity and how it was made (docs/head-roles.md)")
      .def("__init__", [](HeadRoles* self, const std::vector<std::vector<bool>>& retrieval) {
             new (self) HeadRoles(roles_from_matrix(retrieval));
           },
           nb::arg("retrieval"), "From a [n_layers][n_kv_heads] matrix of booleans")
      .def_ro("n_layers", &HeadRoles::n_layers, "the model's layers")
      .def_ro("n_kv_heads", &HeadRoles::n_kv_heads, "KV heads per layer")
      .def_prop_ro("retrieval", &role_matrix, "[n_layers][n_kv_heads] booleans, True = retrieval head")
      .def_prop_ro("n_retrieval", &HeadRoles::n_retrieval, "the number of retrieval heads, layer 0 included")
      .def_ro("expected_z", &HeadRoles::expected_z, "E[z] per head from training ([] when absent)")
      .def_prop_ro("model", [](const HeadRoles& r) { return json_to_python(r.model); },
                   "the model the roles were made for (a dict: name, n_layers, n_kv_heads, ...)")
      .def_prop_ro("provenance", [](const HeadRoles& r) { return json_to_python(r.provenance); },
                   "how the roles were made (a dict: tool, training options, ...)")
      .def("is_retrieval", [](const HeadRoles& r, int layer, int kv_head) {
             LY_CHECK(layer >= 0 && layer < r.n_layers && kv_head >= 0 && kv_head < r.n_kv_heads,
                      ErrorCode::kInvalidArgument, "head ({}, {}) outside the {} x {} role matrix", layer, kv_head,
                      r.n_layers, r.n_kv_heads);
             return r.is_retrieval(layer, kv_head);
           },
           nb::arg("layer"), nb::arg("kv_head"), "Whether (layer, kv_head) is a retrieval head")
      .def("save", [](const HeadRoles& r, const std::filesystem::path& path) { save_head_roles(r, path.string()); },
           nb::arg("path"),
           "Writes lychee's JSON head-role file")
      .def("__eq__",
           [](const HeadRoles& a, nb::handle other) -> nb::object {
             if (!nb::isinstance<HeadRoles>(other)) return nb::borrow(Py_NotImplemented);
             const HeadRoles& b = nb::cast<const HeadRoles&>(other);
             return nb::bool_(a.n_layers == b.n_layers && a.n_kv_heads == b.n_kv_heads && a.retrieval == b.retrieval);
           },
           nb::arg("other"), nb::sig("def __eq__(self, other: object) -> bool"),
           "Equal role matrices (the model and provenance are not compared)")
      .def("__str__", &format_head_role_map, "The role map as text (R = retrieval, . = sparse), a row per layer")
      .def("__repr__", [](const HeadRoles& r) {
        return nb::str("HeadRoles({} layers x {} KV heads, {} retrieval)").format(r.n_layers, r.n_kv_heads, r.n_retrieval());
      });
  m.def("load_head_roles", [](const std::filesystem::path& path) { return load_head_roles_unchecked(path.string()); },
        nb::arg("path"),
        "A head-role file checked for internal consistency only (Engine.load_head_roles checks it against a model)");

  using train::TrainHeadsConfig;
  nb::class_<TrainHeadsConfig>(m, "TrainHeadsConfig", "The options of lychee train-heads (docs/trainer.md)")
      .def(nb::init<>())
      .def_rw("model", &TrainHeadsConfig::model)
      .def_rw("device", &TrainHeadsConfig::device)
      .def_rw("retrieval_heads", &TrainHeadsConfig::retrieval_heads)
      .def_rw("gate", &TrainHeadsConfig::gate)
      .def_rw("data", &TrainHeadsConfig::data)
      .def_rw("haystack", &TrainHeadsConfig::haystack)
      .def_rw("propagate", &TrainHeadsConfig::propagate)
      .def_rw("loss", &TrainHeadsConfig::loss)
      .def_rw("decision", &TrainHeadsConfig::decision)
      .def_rw("steps", &TrainHeadsConfig::steps)
      .def_rw("min_len", &TrainHeadsConfig::min_len)
      .def_rw("max_len", &TrainHeadsConfig::max_len)
      .def_rw("passkeys", &TrainHeadsConfig::passkeys)
      .def_rw("passkey_words", &TrainHeadsConfig::passkey_words)
      .def_rw("lr", &TrainHeadsConfig::lr)
      .def_rw("lambda_lr", &TrainHeadsConfig::lambda_lr)
      .def_rw("lambda_init", &TrainHeadsConfig::lambda_init)
      .def_rw("keep_ratio", &TrainHeadsConfig::keep_ratio)
      .def_rw("seed", &TrainHeadsConfig::seed)
      .def_rw("out", &TrainHeadsConfig::out)
      .def_rw("resume", &TrainHeadsConfig::resume)
      .def_rw("log_every", &TrainHeadsConfig::log_every)
      .def_rw("checkpoint_every", &TrainHeadsConfig::checkpoint_every)
      .def_rw("tf32", &TrainHeadsConfig::tf32)
      .def_rw("stop_after", &TrainHeadsConfig::stop_after)
      .def_rw("prefill", &TrainHeadsConfig::prefill)
      .def_rw("teacher_attention", &TrainHeadsConfig::teacher_attention)
      .def_rw("data_parallel", &TrainHeadsConfig::data_parallel)
      .def_rw("gpus", &TrainHeadsConfig::gpus);

  m.def("train_heads",
        [](const TrainHeadsConfig& config, nb::object progress) {
          std::optional<train::TrainHeadsRun> run;
          {
            nb::gil_scoped_release release;
            // Progress lines reach Python with the GIL held; an exception there (KeyboardInterrupt
            // from the signal check included) stops the training and is raised to the caller.
            run = train::train_heads(config, [&progress](const std::string& line) {
              nb::gil_scoped_acquire acquire;
              if (!progress.is_none()) progress(utf8_str(line));
              if (PyErr_CheckSignals() != 0) throw nb::python_error();
            });
          }
          const train::TrainResult& r = run->result;
          nb::dict d;
          d["roles"] = nb::cast(r.roles);
          d["out_dir"] = run->out_dir;
          d["device"] = run->device;
          d["target_retrieval_heads"] = run->n_target;
          d["expected_z"] = r.expected_z;
          d["final_loss"] = r.final_loss;
          d["lambda"] = r.lambda;
          d["expected_l0"] = r.expected_l0;
          d["seconds"] = r.seconds;
          d["steps_run"] = r.steps_run;
          d["finished"] = r.finished;
          d["summary"] = json_to_python(r.summary);
          return d;
        },
        nb::arg("config"), nb::arg("progress").none(), "Learns head roles (use lychee.train_heads)");

  m.def("select_units_reference",
        [](const std::vector<float>& scores, int unit_size, int n_tokens, const std::string& strategy, int budget,
           double value, int sink, int recent, float scale) {
          SelectParams p;
          p.strategy = parse_select_strategy(strategy);
          p.budget = budget;
          p.value = value;
          p.sink = sink;
          p.recent = recent;
          p.validate();
          LY_CHECK(unit_size >= 1 && n_tokens >= 1 && int64_t(scores.size()) == (n_tokens + unit_size - 1) / unit_size,
                   ErrorCode::kInvalidArgument, "select_units_reference: {} scores for {} tokens in units of {}",
                   scores.size(), n_tokens, unit_size);
          return select_units(scores, unit_size, n_tokens, p, scale);
        },
        nb::arg("scores"), nb::arg("unit_size"), nb::arg("n_tokens"), nb::arg("strategy"), nb::arg("budget"),
        nb::arg("value"), nb::arg("sink"), nb::arg("recent"), nb::arg("scale"),
        "The CPU reference selection (attention/selection.h): ascending unit ids");
  m.def("read_weights", &read_weights, nb::arg("path") = "",
        "Every weight of a checkpoint (\"\" = the default model) as f32 NumPy arrays keyed by Hugging Face name, "
        "dequantised and in HF layout, as the engine loads them");
}

}  // namespace lychee::py
