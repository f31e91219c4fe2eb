// The hot path of a routed call, in C++: launch replay's table, the result check, the reads
// of an input's shape and dtype, and the hit counter.
//
// Launch replay (Note [launch replay] in replay.py): reading the
// layout of a call's tensors costs about 15 ns per tensor here against about 450 ns through
// Python's attribute calls, which was most of a routed small call's overhead.
//
// A Table maps a call's layout (the bytes ``layout`` returns) to the launches recorded for it.
// ``run(*args)`` reads the layout, and where a plan is known, makes its launches with the
// call's tensor addresses and the device's current stream and returns True; otherwise it
// returns False and the caller goes the slow way. Everything else (recording, checking,
// deciding) stays in Python; this file only keys and launches.
//
// The result check (Note [result check] in result_check.py): through Python, the four reads
// it makes of two tensors (dtype, shape, and the device of each) cost about 0.3 µs, a third of
// a value-returning hit's overhead; here they are a few loads. same(out, dtype, shape, like):
// whether ``out`` is a tensor of dtype ``dtype`` on the device of the tensor ``like`` whose
// sizes are ``shape`` (a sequence of ints: a torch.Size, a tuple) or, where ``shape`` is an
// int, whose number of dimensions is ``shape``. All of it lives in one translation unit: the
// runtime builds one extension, and torch's headers are compiled once.

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <ATen/PythonTorchFunctionTLS.h>
#include <torch/csrc/DynamicTypes.h>
#include <torch/csrc/Dtype.h>
#include <torch/csrc/autograd/python_variable.h>

#include <cstring>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

namespace {

struct Launch {
  PyObject* launcher = nullptr;        // the compiled kernel's launch function (owned)
  std::vector<PyObject*> args;         // its arguments; nullptr where filled per call (owned)
  std::vector<std::pair<int, int>> pointers;  // (argument position, tensor index)
};

struct Plan {
  PyObject* device = nullptr;  // the device index, as an int (owned)
  std::vector<Launch> launches;
};

struct Table {
  PyObject_HEAD
  std::unordered_map<std::string, Plan>* plans;
  PyObject* stream_of;  // device -> raw stream (owned)
  PyObject* hooks;      // Triton's launch hook chains: a tuple (owned)
};

void release(Plan& plan) {
  Py_XDECREF(plan.device);
  for (Launch& l : plan.launches) {
    Py_XDECREF(l.launcher);
    for (PyObject* a : l.args) Py_XDECREF(a);
  }
}

template <typename T>
void put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(T));
}

// The layout of a call, or false where it is not one that is replayed (an address that is
// not 16-byte aligned, an argument of a kind not keyed). ``addresses`` gets each tensor's.
bool layout(PyObject* const* args, Py_ssize_t nargs, std::string& out,
            std::vector<uint64_t>& addresses) {
  out.clear();
  addresses.clear();
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    PyObject* a = args[i];
    if (THPVariable_Check(a)) {
      const at::Tensor& t = THPVariable_Unpack(a);
      if (!t.defined() || !t.has_storage()) return false;
      uint64_t address;
      try {
        address = reinterpret_cast<uint64_t>(t.data_ptr());
      } catch (...) {
        return false;
      }
      if (address & 15) return false;
      out.push_back('T');
      put<int8_t>(out, static_cast<int8_t>(t.scalar_type()));
      put<int16_t>(out, static_cast<int16_t>(t.is_cpu() ? -1 : t.get_device()));
      const auto sizes = t.sizes();
      const auto strides = t.strides();
      put<int8_t>(out, static_cast<int8_t>(sizes.size()));
      for (size_t d = 0; d < sizes.size(); ++d) {
        put<int64_t>(out, sizes[d]);
        put<int64_t>(out, strides[d]);
      }
      addresses.push_back(address);
    } else if (a == Py_None) {
      out.push_back('N');
    } else if (PyBool_Check(a)) {
      out.push_back(a == Py_True ? 'Y' : 'F');
    } else if (PyLong_CheckExact(a)) {
      int overflow = 0;
      long long v = PyLong_AsLongLongAndOverflow(a, &overflow);
      if (overflow || (v == -1 && PyErr_Occurred())) {
        PyErr_Clear();
        return false;
      }
      out.push_back('I');
      put<int64_t>(out, v);
    } else if (PyFloat_CheckExact(a)) {
      out.push_back('D');
      put<double>(out, PyFloat_AS_DOUBLE(a));
    } else {
      return false;
    }
  }
  // Which tensors are the same buffer: the index of each address's first occurrence.
  out.push_back('A');
  for (size_t i = 0; i < addresses.size(); ++i) {
    size_t first = i;
    for (size_t j = 0; j < i; ++j) {
      if (addresses[j] == addresses[i]) {
        first = j;
        break;
      }
    }
    put<int16_t>(out, static_cast<int16_t>(first));
  }
  return true;
}

bool hooks_set(Table* self) {
  Py_ssize_t n = PyTuple_GET_SIZE(self->hooks);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* calls = PyObject_GetAttrString(PyTuple_GET_ITEM(self->hooks, i), "calls");
    if (calls == nullptr) {
      PyErr_Clear();
      return true;
    }
    Py_ssize_t size = PyObject_Length(calls);
    Py_DECREF(calls);
    if (size != 0) {
      PyErr_Clear();
      return true;
    }
  }
  return false;
}

PyObject* table_run(Table* self, PyObject* const* args, Py_ssize_t nargs) {
  thread_local std::string key;
  thread_local std::vector<uint64_t> addresses;
  if (!layout(args, nargs, key, addresses)) Py_RETURN_FALSE;
  auto found = self->plans->find(key);
  if (found == self->plans->end() || hooks_set(self)) Py_RETURN_FALSE;
  Plan& plan = found->second;
  PyObject* stream = PyObject_CallOneArg(self->stream_of, plan.device);
  if (stream == nullptr) return nullptr;
  std::vector<PyObject*> pointers(addresses.size(), nullptr);
  PyObject* result = Py_True;
  for (size_t i = 0; i < addresses.size(); ++i) {
    pointers[i] = PyLong_FromUnsignedLongLong(addresses[i]);
    if (pointers[i] == nullptr) result = nullptr;
  }
  for (Launch& l : plan.launches) {
    if (result == nullptr) break;
    std::vector<PyObject*> argv(l.args);
    argv[3] = stream;
    for (const auto& slot : l.pointers) argv[slot.first] = pointers[slot.second];
    PyObject* r = PyObject_Vectorcall(l.launcher, argv.data(), argv.size(), nullptr);
    if (r == nullptr) {
      result = nullptr;
    } else {
      Py_DECREF(r);
    }
  }
  for (PyObject* p : pointers) Py_XDECREF(p);
  Py_DECREF(stream);
  if (result == nullptr) return nullptr;
  Py_RETURN_TRUE;
}

PyObject* table_layout(Table* self, PyObject* const* args, Py_ssize_t nargs) {
  std::string key;
  std::vector<uint64_t> addresses;
  if (!layout(args, nargs, key, addresses)) Py_RETURN_NONE;
  return PyBytes_FromStringAndSize(key.data(), key.size());
}

// set(layout, device, launches): launches is a sequence of
// (launcher, args, ((position, tensor index), ...)); args[3] is where the stream goes.
PyObject* table_set(Table* self, PyObject* args) {
  const char* data;
  Py_ssize_t size;
  PyObject* device;
  PyObject* launches;
  if (!PyArg_ParseTuple(args, "y#OO", &data, &size, &device, &launches)) return nullptr;
  PyObject* seq = PySequence_Fast(launches, "launches must be a sequence");
  if (seq == nullptr) return nullptr;
  Plan plan;
  Py_INCREF(device);
  plan.device = device;
  bool ok = true;
  for (Py_ssize_t i = 0; ok && i < PySequence_Fast_GET_SIZE(seq); ++i) {
    PyObject* launcher;
    PyObject* largs;
    PyObject* slots;
    if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "OO!O!", &launcher, &PyTuple_Type,
                          &largs, &PyTuple_Type, &slots)) {
      ok = false;
      break;
    }
    Launch l;
    Py_INCREF(launcher);
    l.launcher = launcher;
    for (Py_ssize_t k = 0; k < PyTuple_GET_SIZE(largs); ++k) {
      PyObject* a = PyTuple_GET_ITEM(largs, k);
      Py_INCREF(a);
      l.args.push_back(a);
    }
    for (Py_ssize_t k = 0; ok && k < PyTuple_GET_SIZE(slots); ++k) {
      int position, tensor;
      if (!PyArg_ParseTuple(PyTuple_GET_ITEM(slots, k), "ii", &position, &tensor)) {
        ok = false;
      } else if (position < 4 || position >= static_cast<int>(l.args.size()) || tensor < 0) {
        PyErr_SetString(PyExc_ValueError, "a pointer slot is out of range");
        ok = false;
      } else {
        l.pointers.emplace_back(position, tensor);
      }
    }
    if (l.args.size() < 4) {
      PyErr_SetString(PyExc_ValueError, "a launch takes a grid and a stream first");
      ok = false;
    }
    plan.launches.push_back(std::move(l));
  }
  Py_DECREF(seq);
  if (!ok) {
    release(plan);
    return nullptr;
  }
  std::string key(data, size);
  auto found = self->plans->find(key);
  if (found != self->plans->end()) {
    release(found->second);
    self->plans->erase(found);
  }
  self->plans->emplace(std::move(key), std::move(plan));
  Py_RETURN_NONE;
}

PyObject* table_len(Table* self, PyObject*) {
  return PyLong_FromSize_t(self->plans->size());
}

int table_init(Table* self, PyObject* args, PyObject* kwargs) {
  PyObject* stream_of;
  PyObject* hooks;
  if (!PyArg_ParseTuple(args, "OO!", &stream_of, &PyTuple_Type, &hooks)) return -1;
  Py_INCREF(stream_of);
  Py_INCREF(hooks);
  Py_XSETREF(self->stream_of, stream_of);
  Py_XSETREF(self->hooks, hooks);
  if (self->plans == nullptr) self->plans = new std::unordered_map<std::string, Plan>();
  return 0;
}

void table_dealloc(Table* self) {
  if (self->plans != nullptr) {
    for (auto& item : *self->plans) release(item.second);
    delete self->plans;
  }
  Py_XDECREF(self->stream_of);
  Py_XDECREF(self->hooks);
  Py_TYPE(self)->tp_free(reinterpret_cast<PyObject*>(self));
}

PyMethodDef table_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(table_run)),
     METH_FASTCALL, "Replay the launches of the call's layout: True, or False where none."},
    {"layout", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(table_layout)),
     METH_FASTCALL, "The call's layout as bytes, or None where it is not replayed."},
    {"set", reinterpret_cast<PyCFunction>(table_set), METH_VARARGS,
     "set(layout, device, launches): keep the launches of a layout."},
    {"size", reinterpret_cast<PyCFunction>(table_len), METH_NOARGS, "How many layouts."},
    {nullptr, nullptr, 0, nullptr}};

PyTypeObject TableType = {PyVarObject_HEAD_INIT(nullptr, 0)};

// ---------------------------------------------------------------- the result check

PyObject* same(PyObject* /*self*/, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 4) {
    PyErr_SetString(PyExc_TypeError, "same(out, dtype, shape, like) takes 4 arguments");
    return nullptr;
  }
  PyObject* out = args[0];
  PyObject* dtype = args[1];
  PyObject* shape = args[2];
  PyObject* like = args[3];
  if (!THPVariable_Check(out) || !THPVariable_Check(like) || !THPDtype_Check(dtype)) {
    Py_RETURN_FALSE;
  }
  const at::Tensor& t = THPVariable_Unpack(out);
  if (t.scalar_type() != reinterpret_cast<THPDtype*>(dtype)->scalar_type) Py_RETURN_FALSE;
  if (t.device() != THPVariable_Unpack(like).device()) Py_RETURN_FALSE;
  if (PyLong_Check(shape)) {
    if (t.dim() != PyLong_AsLongLong(shape)) Py_RETURN_FALSE;
    Py_RETURN_TRUE;
  }
  if (!PyTuple_Check(shape)) Py_RETURN_FALSE;  // torch.Size is a tuple
  Py_ssize_t n = PyTuple_GET_SIZE(shape);
  if (t.dim() != n) Py_RETURN_FALSE;
  auto sizes = t.sym_sizes();
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* item = PyTuple_GET_ITEM(shape, i);
    if (!PyLong_Check(item)) Py_RETURN_FALSE;
    long long want = PyLong_AsLongLong(item);
    if (want == -1 && PyErr_Occurred()) return nullptr;
    auto got = sizes[i].maybe_as_int();
    if (!got.has_value() || *got != want) Py_RETURN_FALSE;
  }
  Py_RETURN_TRUE;
}

// ------------------------------------------------------------ the reads of the hit path
//
// ``shape_of(x)`` and ``dtype_of(x)`` are ``x.shape`` and ``x.dtype`` (Note [native reads] in
// result_check.py): for a plain tensor, read here in a few loads (the shape as a tuple of
// ints rather than a torch.Size); for anything else (a subclass, a tensor under a
// __torch_function__ mode, symbolic sizes, not a tensor at all), the attribute read through
// Python, exactly as the dispatcher would have read it.

// Whether torch's attribute getters would read ``x`` without a __torch_function__ hop: a plain
// tensor (Tensor or Parameter) with no mode active and no skip pending. The getters' own test
// consumes the skip flag; where it is set, the read goes through Python, which consumes it.
//
// The skip flag is newer than some torch releases fibgen supports (torch 2.11 has none): where
// the TLS class has no ``peek_skip_next``, no skip can be pending.
template <typename TLS, typename = void>
struct HasSkipFlag : std::false_type {};
template <typename TLS>
struct HasSkipFlag<TLS, std::void_t<decltype(TLS::peek_skip_next())>> : std::true_type {};

template <typename TLS>
bool skip_pending() {
  if constexpr (HasSkipFlag<TLS>::value) {
    return TLS::peek_skip_next();
  } else {
    return false;
  }
}

bool plain(PyObject* x) {
  return THPVariable_CheckExact(x) && !at::impl::torch_function_mode_enabled() &&
         !skip_pending<at::impl::PythonTorchFunctionTLS>();
}

PyObject* shape_of(PyObject* /*self*/, PyObject* x) {
  if (plain(x)) {
    try {
      const at::Tensor& t = THPVariable_Unpack(x);
      if (t.defined() && !t.unsafeGetTensorImpl()->has_symbolic_sizes_strides()) {
        at::IntArrayRef sizes = t.sizes();
        Py_ssize_t n = static_cast<Py_ssize_t>(sizes.size());
        PyObject* out = PyTuple_New(n);
        if (out == nullptr) return nullptr;
        for (Py_ssize_t i = 0; i < n; ++i) {
          PyObject* item = PyLong_FromLongLong(sizes[i]);
          if (item == nullptr) {
            Py_DECREF(out);
            return nullptr;
          }
          PyTuple_SET_ITEM(out, i, item);
        }
        return out;
      }
    } catch (...) {
      // A tensor whose sizes C++ cannot read this way (nested): Python's read says why.
    }
  }
  return PyObject_GetAttrString(x, "shape");
}

PyObject* dtype_of(PyObject* /*self*/, PyObject* x) {
  if (plain(x)) {
    const at::Tensor& t = THPVariable_Unpack(x);
    if (t.defined()) {
      PyObject* dtype = reinterpret_cast<PyObject*>(torch::getTHPDtype(t.scalar_type()));
      Py_INCREF(dtype);
      return dtype;
    }
  }
  return PyObject_GetAttrString(x, "dtype");
}

// ------------------------------------------------------------------- the hit counter
//
// A Tally counts the calls of a route (fibgen/runtime/counters.py): calling it adds one and
// returns None, with no int made and freed per call as ``itertools.count.__next__`` does.
// The increment runs under the GIL, so counts are exact under threads without a lock.

struct Tally {
  PyObject_HEAD
  long long count;
  vectorcallfunc vectorcall;
};

PyObject* tally_call(PyObject* self, PyObject* const* /*args*/, size_t nargsf, PyObject* kwnames) {
  if (PyVectorcall_NARGS(nargsf) != 0 || (kwnames != nullptr && PyTuple_GET_SIZE(kwnames) != 0)) {
    PyErr_SetString(PyExc_TypeError, "a Tally takes no arguments");
    return nullptr;
  }
  ++reinterpret_cast<Tally*>(self)->count;
  Py_RETURN_NONE;
}

PyObject* tally_new(PyTypeObject* type, PyObject* /*args*/, PyObject* /*kwargs*/) {
  Tally* self = reinterpret_cast<Tally*>(type->tp_alloc(type, 0));
  if (self != nullptr) {
    self->count = 0;
    self->vectorcall = tally_call;
  }
  return reinterpret_cast<PyObject*>(self);
}

PyObject* tally_value(PyObject* self, void* /*closure*/) {
  return PyLong_FromLongLong(reinterpret_cast<Tally*>(self)->count);
}

PyGetSetDef tally_getset[] = {
    {"value", tally_value, nullptr, "How many times it was called.", nullptr},
    {nullptr, nullptr, nullptr, nullptr, nullptr}};

PyTypeObject TallyType = {PyVarObject_HEAD_INIT(nullptr, 0)};

PyMethodDef module_methods[] = {
    {"shape_of", shape_of, METH_O, "x.shape; a tuple of ints for a plain tensor."},
    {"dtype_of", dtype_of, METH_O, "x.dtype."},
    {"same", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)(void)>(same)),
     METH_FASTCALL, "Whether a routed call's output is what the definition declares."},
    {nullptr, nullptr, 0, nullptr}};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, nullptr, nullptr, -1, module_methods};

}  // namespace

#define FIBGEN_CAT_(a, b) a##b
#define FIBGEN_CAT(a, b) FIBGEN_CAT_(a, b)
#define FIBGEN_STR_(x) #x
#define FIBGEN_STR(x) FIBGEN_STR_(x)

PyMODINIT_FUNC FIBGEN_CAT(PyInit_, TORCH_EXTENSION_NAME)(void) {
  TableType.tp_name = FIBGEN_STR(TORCH_EXTENSION_NAME) ".Table";
  TableType.tp_basicsize = sizeof(Table);
  TableType.tp_flags = Py_TPFLAGS_DEFAULT;
  TableType.tp_doc = "Launches kept per call layout.";
  TableType.tp_new = PyType_GenericNew;
  TableType.tp_init = reinterpret_cast<initproc>(table_init);
  TableType.tp_dealloc = reinterpret_cast<destructor>(table_dealloc);
  TableType.tp_methods = table_methods;
  if (PyType_Ready(&TableType) < 0) return nullptr;
  TallyType.tp_name = FIBGEN_STR(TORCH_EXTENSION_NAME) ".Tally";
  TallyType.tp_basicsize = sizeof(Tally);
  TallyType.tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_VECTORCALL;
  TallyType.tp_doc = "A counter: calling it adds one.";
  TallyType.tp_new = tally_new;
  TallyType.tp_call = PyVectorcall_Call;
  TallyType.tp_vectorcall_offset = offsetof(Tally, vectorcall);
  TallyType.tp_getset = tally_getset;
  if (PyType_Ready(&TallyType) < 0) return nullptr;
  module_def.m_name = FIBGEN_STR(TORCH_EXTENSION_NAME);
  PyObject* m = PyModule_Create(&module_def);
  if (m == nullptr) return nullptr;
  Py_INCREF(&TableType);
  if (PyModule_AddObject(m, "Table", reinterpret_cast<PyObject*>(&TableType)) < 0) {
    Py_DECREF(&TableType);
    Py_DECREF(m);
    return nullptr;
  }
  Py_INCREF(&TallyType);
  if (PyModule_AddObject(m, "Tally", reinterpret_cast<PyObject*>(&TallyType)) < 0) {
    Py_DECREF(&TallyType);
    Py_DECREF(m);
    return nullptr;
  }
  return m;
}
