// lychee._lychee: the engine for Python. The public API is the package lychee (python/lychee),
// which wraps these classes; errors of the engine arrive as exceptions of lychee.Error's
// subclasses, each also a built-in exception of the matching kind, carrying the engine's message.
#include <Python.h>

#include <nanobind/stl/string.h>

#include "bindings.h"
#include "core/error.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "runtime/threads.h"

namespace lychee::py {

nb::str utf8_str(std::string_view bytes) {
  PyObject* s = PyUnicode_DecodeUTF8(bytes.data(), Py_ssize_t(bytes.size()), "replace");
  if (s == nullptr) throw nb::python_error();
  return nb::steal<nb::str>(s);
}

nb::object json_to_python(const nlohmann::json& j) {
  return nb::module_::import_("json").attr("loads")(j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
}

namespace {

// One Python class per ErrorCode: lychee.Error and the built-in it is a kind of.
struct ErrorClasses {
  PyObject* base = nullptr;
  PyObject* by_code[int(ErrorCode::kInternal) + 1] = {};
  PyObject* busy = nullptr;  // EngineBusy
};
ErrorClasses g_errors;

PyObject* new_error_class(nb::module_& m, const char* name, PyObject* builtin, const char* doc) {
  // Defined in lychee._lychee (so that the stub declares them); the package shows them as lychee.<name>.
  const std::string qualified = std::string("lychee._lychee.") + name;
  PyObject* bases = builtin != nullptr ? PyTuple_Pack(2, g_errors.base, builtin) : nullptr;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, builtin != nullptr ? bases : PyExc_Exception, nullptr);
  Py_XDECREF(bases);
  if (cls == nullptr) throw nb::python_error();
  m.attr(name) = nb::borrow(cls);
  return cls;
}

void register_errors(nb::module_& m) {
  g_errors.base = new_error_class(m, "Error", nullptr, "Base class of the errors lychee's engine raises.");
  auto& c = g_errors.by_code;
  c[int(ErrorCode::kInvalidArgument)] =
      new_error_class(m, "InvalidArgumentError", PyExc_ValueError, "A bad option, prompt or shape (a ValueError).");
  c[int(ErrorCode::kInvalidFile)] =
      new_error_class(m, "InvalidFileError", PyExc_ValueError, "A corrupt or malformed file (a ValueError).");
  c[int(ErrorCode::kNotFound)] =
      new_error_class(m, "NotFoundError", PyExc_FileNotFoundError, "A missing file, tensor or key (a FileNotFoundError).");
  c[int(ErrorCode::kUnsupported)] = new_error_class(
      m, "UnsupportedError", PyExc_NotImplementedError, "Valid input this build or device does not handle (a NotImplementedError).");
  c[int(ErrorCode::kCapacity)] =
      new_error_class(m, "CapacityError", PyExc_MemoryError, "A full KV cache or a context too long (a MemoryError).");
  c[int(ErrorCode::kCuda)] = new_error_class(m, "CudaError", PyExc_RuntimeError, "A CUDA failure (a RuntimeError).");
  c[int(ErrorCode::kInternal)] =
      new_error_class(m, "InternalError", PyExc_RuntimeError, "A broken invariant: a bug in lychee (a RuntimeError).");
  g_errors.busy = new_error_class(
      m, "EngineBusyError", PyExc_RuntimeError,
      "A request while a stream's generation holds the engine (a RuntimeError): read the stream to its end,\n"
      "close() it or leave its with block first.");
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const Error& e) {
      PyErr_SetString(g_errors.by_code[int(e.code())], e.what());
    } catch (const EngineBusy& e) {
      PyErr_SetString(g_errors.busy, e.what());
    }
  });
}

}  // namespace

}  // namespace lychee::py

NB_MODULE(_lychee, m) {
  using namespace lychee;
  using namespace lychee::py;
  m.doc() = "lychee's engine (runtime, eval, train); use the package lychee";
  register_errors(m);
  m.def("default_model_path", &default_model_path,
        "The default model's path: $LYCHEE_MODEL, else the SmolLM2-135M-Instruct GGUF under models_dir().");
  m.def("models_dir", &models_dir, "Where fetched assets live: $LYCHEE_MODELS_DIR or <source>/models.");
  m.def("cuda_device_status", &cuda_device_status,
        "\"\" when this build has CUDA and a usable device, else why not.");
  m.def("resolve_device", &resolve_device, nb::arg("requested"),
        "\"cpu\", \"cuda\" or \"auto\" resolved on this machine.");
  m.def("set_threads", &set_compute_threads, nb::arg("n") = 0,
        "Sets the CPU backend's OpenMP and OpenBLAS threads (0 = the cores this process may use); returns the count.");
  m.def("threads", &compute_threads, "The CPU backend's compute threads.");
  bind_roles(m);
  bind_engine(m);
}
