// memc's Python extension (_memc): the command line in-process (every compile option, with its
// one-line errors and exit codes) and the Session (runtime/session.h) over NumPy arrays. The
// package python/memc wraps both into memc.compile, Plan.fit/step/predict/state_dict.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>

#include "runtime/dataset.h"
#include "runtime/session.h"
#include "tools/commands.h"

namespace nb = nanobind;

namespace memc::python {
namespace {

// A file's text ("" when unreadable).
std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs the CLI with stdout and stderr sent to files, as a child process's would be: returns
// (exit status, stdout, stderr). The interpreter's own streams are flushed first and restored after.
// `on_step(step, loss)`, unless None, is called after each step of `memc run` (with the GIL);
// returning False ends training there. An exception it raises, or a signal's (Ctrl-C), ends
// training too and is raised here once memc has stopped.
std::tuple<int, std::string, std::string> run_cli(const std::vector<std::string>& args, const nb::object& on_step) {
  std::vector<std::string> argv_text = {"memc"};
  argv_text.insert(argv_text.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (std::string& a : argv_text) argv.push_back(a.data());
  argv.push_back(nullptr);
  char out_path[] = "/tmp/memc_cli_out_XXXXXX", err_path[] = "/tmp/memc_cli_err_XXXXXX";
  const int out_fd = mkstemp(out_path), err_fd = mkstemp(err_path);
  if (out_fd < 0 || err_fd < 0) throw std::runtime_error("memc: cannot create a temporary file for the CLI's output");
  std::fflush(stdout);
  std::fflush(stderr);
  const int saved_out = dup(1), saved_err = dup(2);
  dup2(out_fd, 1);
  dup2(err_fd, 2);
  std::optional<nb::python_error> raised;
  cli::CliHooks hooks;
  if (!on_step.is_none()) {
    hooks.on_step = [&](int64_t step, double loss) {
      nb::gil_scoped_acquire gil;
      try {
        if (PyErr_CheckSignals() != 0) throw nb::python_error();
        const nb::object go_on = on_step(step, loss);
        return go_on.is_none() || nb::cast<bool>(go_on);
      } catch (nb::python_error& e) {
        raised.emplace(std::move(e));
      } catch (const std::exception& e) {  // a result that is not a bool
        PyErr_SetString(PyExc_TypeError, e.what());
        raised.emplace();
      }
      return false;
    };
  }
  int status;
  {
    nb::gil_scoped_release release;  // training may take a while; other Python threads go on
    status = cli::run_cli(static_cast<int>(argv_text.size()), argv.data(), hooks);
    std::fflush(stdout);
    std::fflush(stderr);
  }
  dup2(saved_out, 1);
  dup2(saved_err, 2);
  for (int fd : {saved_out, saved_err, out_fd, err_fd}) close(fd);
  std::string out = slurp(out_path), err = slurp(err_path);
  std::remove(out_path);
  std::remove(err_path);
  if (raised) throw *raised;
  return {status, out, err};
}

// The error type the package raises: Python's ValueError family for bad input (memc.MemcError
// subclasses it in python/memc/__init__.py); RuntimeError for internal errors.
[[noreturn]] void raise(const Status& st) {
  const std::string line = "memc: " + st.message();
  if (st.kind() == ErrorKind::kBadInput || st.kind() == ErrorKind::kBudget) throw nb::value_error(line.c_str());
  throw std::runtime_error(line);
}
template <class T>
T value_or_raise(Expected<T> e) {
  if (!e.ok()) raise(e.status());
  return std::move(e).value();
}

using Array = nb::ndarray<nb::numpy, nb::c_contig, nb::device::cpu>;
using InArray = nb::ndarray<nb::numpy, nb::ro, nb::c_contig, nb::device::cpu>;  // read-only arrays too (np.load's mmap)

std::optional<DType> dtype_of(const nb::dlpack::dtype& d) {
  using Code = nb::dlpack::dtype_code;
  const auto code = static_cast<Code>(d.code);
  if (code == Code::Float && d.bits == 32) return DType::kF32;
  if (code == Code::Float && d.bits == 64) return DType::kF64;
  if (code == Code::Float && d.bits == 16) return DType::kF16;
  if (code == Code::Int && d.bits == 64) return DType::kI64;
  if (code == Code::Int && d.bits == 32) return DType::kI32;
  if (code == Code::UInt && d.bits == 8) return DType::kU8;
  if (code == Code::Bool && d.bits == 8) return DType::kBool;
  return std::nullopt;
}

// A dict of NumPy arrays as memc tensors that borrow the arrays' memory (the step copies each
// into the arena once). `owners` keeps the arrays alive: the caller's, or nanobind's contiguous
// conversion of them.
TensorMap tensors_of(const nb::dict& arrays, std::vector<InArray>& owners) {
  TensorMap out;
  for (auto [key, value] : arrays) {
    const std::string name = nb::cast<std::string>(key);
    InArray a;
    if (!nb::try_cast(value, a)) {
      throw nb::type_error(("memc: array '" + name + "' is not a C-contiguous NumPy array on the CPU").c_str());
    }
    const std::optional<DType> dtype = dtype_of(a.dtype());
    if (!dtype) throw nb::type_error(("memc: array '" + name + "' has a dtype memc does not read (float16/32/64, int32/64, uint8, bool)").c_str());
    Shape shape;
    for (size_t d = 0; d < a.ndim(); ++d) shape.push_back(static_cast<int64_t>(a.shape(d)));
    out[name] = Tensor::borrow(*dtype, shape, const_cast<void*>(a.data()));  // only read
    owners.push_back(std::move(a));
  }
  return out;
}

nb::object array_of(const Tensor& t) {
  const Tensor f = t.dtype() == DType::kBF16 ? t.cast(DType::kF32) : t;  // NumPy has no bf16
  std::vector<size_t> shape(f.shape().begin(), f.shape().end());
  auto* copy = new Tensor(f.clone());
  nb::capsule owner(copy, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
  nb::dlpack::dtype dt;
  switch (f.dtype()) {
    case DType::kF32: dt = nb::dtype<float>(); break;
    case DType::kF64: dt = nb::dtype<double>(); break;
    case DType::kI64: dt = nb::dtype<int64_t>(); break;
    case DType::kI32: dt = nb::dtype<int32_t>(); break;
    case DType::kU8: dt = nb::dtype<uint8_t>(); break;
    case DType::kBool: dt = nb::dtype<bool>(); break;
    default: {
      Tensor* widened = new Tensor(f.cast(DType::kF32));
      delete copy;
      copy = widened;
      owner = nb::capsule(copy, [](void* p) noexcept { delete static_cast<Tensor*>(p); });
      dt = nb::dtype<float>();
    }
  }
  return nb::cast(Array(copy->raw(), shape.size(), shape.data(), owner, nullptr, dt));
}

nb::dict dict_of(const TensorMap& tensors) {
  nb::dict out;
  for (const auto& [name, t] : tensors) out[name.c_str()] = array_of(t);
  return out;
}

// The forward's arguments of `role` (parameters, buffers) by their initializers' names.
std::vector<std::string> state_names(const Session& s, Role role) {
  std::vector<std::string> names;
  for (ValueId a : s.plan().eval.arguments()) {
    if (s.plan().eval.value(a).role == role) names.push_back(s.plan().eval.value(a).source_name);
  }
  return names;
}

}  // namespace
}  // namespace memc::python

NB_MODULE(_memc, m) {
  using namespace memc;
  using namespace memc::python;
  m.doc() = "memc's C++ library: the command line in-process and the Session over NumPy arrays";
  m.def("cli", &run_cli, nb::arg("args"), nb::arg("on_step") = nb::none(),
        "Runs `memc ARGS...`: (exit status, stdout, stderr); on_step(step, loss) after each step of a run (False stops it)");
  m.def("epoch_order", &epoch_order, nb::arg("size"), nb::arg("seed"), nb::arg("epoch"),
        "The sample order of an epoch of `memc run` (runtime/dataset.h): the same seeded shuffle");
  nb::class_<Session>(m, "Session")
      .def_static(
          "open",
          [](const std::string& plan, const std::string& device, uint64_t seed, int64_t total_steps) {
            return value_or_raise(Session::open(plan, SessionOptions{.device = device, .seed = seed, .total_steps = total_steps})).release();
          },
          nb::arg("plan"), nb::arg("device") = "", nb::arg("seed") = 0, nb::arg("total_steps") = -1, nb::rv_policy::take_ownership)
      .def(
          "step",
          [](Session& s, const nb::dict& batch) {
            std::vector<InArray> owners;
            const TensorMap tensors = tensors_of(batch, owners);
            Expected<double> loss = [&] {
              nb::gil_scoped_release release;
              return s.step(tensors);
            }();
            return value_or_raise(std::move(loss));
          },
          nb::arg("batch"))
      .def(
          "predict",
          [](Session& s, const nb::dict& inputs) {
            std::vector<InArray> owners;
            return array_of(value_or_raise(s.predict(tensors_of(inputs, owners))));
          },
          nb::arg("inputs"))
      .def("state", [](const Session& s) { return dict_of(value_or_raise(s.state())); })
      .def(
          "restore",
          [](Session& s, const std::string& dir) {
            if (Status st = s.restore(dir); !st.ok()) raise(st);
          },
          nb::arg("checkpoint_dir"))
      .def_prop_ro("steps", &Session::steps)
      .def_prop_ro("last_step_ms", &Session::last_step_ms)
      .def_prop_ro("measured_peak_bytes", &Session::measured_peak_bytes)
      .def_prop_ro("device", &Session::device)
      .def_prop_ro("batch", [](const Session& s) { return s.plan().batch; })
      .def_prop_ro("parameters", [](const Session& s) { return state_names(s, Role::kParam); })  // the trained initializers
      .def_prop_ro("buffers", [](const Session& s) { return state_names(s, Role::kBuffer); });  // BatchNorm's running statistics
}
