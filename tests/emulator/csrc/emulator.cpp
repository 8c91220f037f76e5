// An emulated accelerator: a PrivateUse1 backend whose device memory is host memory owned by
// its own allocator and whose compute runs CPU kernels through a boxed fallback.
//
// It is test support for lightning-anyaccel, modelled on what out-of-tree vendors (torch_npu,
// torch_mlu, ...) register with PyTorch: a device guard with N devices, an allocator with
// statistics, generators, hooks, copies, autocast kernels and a CPU fallback. The Python side
// (tests/emulator/__init__.py) renames the backend and registers the device module and the
// collective backend. Nothing here is fast and nothing proves vendor kernels correct.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/autocast_mode.h>
#include <ATen/detail/HPUHooksInterface.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/detail/XPUHooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/native/Resize.h>
#include <ATen/ops/as_strided_cpu_dispatch.h>
#include <ATen/ops/set_cpu_dispatch.h>
#include <ATen/ops/_local_scalar_dense_native.h>
#include <ATen/ops/unfold_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <ATen/ops/set_native.h>
#include <ATen/ops/copy_native.h>
#include <c10/core/CachingDeviceAllocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/csrc/utils/pybind.h>
// not <torch/extension.h>: it adds torch's whole C++ frontend (torch/all.h), unused here, and a third
// to the compile time of every build (tests/emulator/_build_ext.py; 25 s against 19 s on 2 idle cores)
#include <torch/library.h>
#include <torch/version.h>

#include <pthread.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace emulator {

using c10::DeviceIndex;
using c10::DeviceType;

// ---------------------------------------------------------------- runtime state

constexpr DeviceIndex kMaxDevices = 16;
std::atomic<int> g_device_count{2};
std::atomic<bool> g_initialized{false};
std::atomic<bool> g_in_bad_fork{false};
std::atomic<bool> g_count_frozen{false};
thread_local DeviceIndex t_current_device = 0;
// The device type this process serves: PrivateUse1 (renamed by the Python side), XPU or HPU.
// Chosen once by activate(); every registration below is made for it at that moment.
DeviceType g_type = DeviceType::PrivateUse1;
c10::DispatchKey g_key = c10::DispatchKey::PrivateUse1;

bool on_device(const at::Tensor& t) {
  return t.defined() && t.device().type() == g_type;
}
// Memory each emulated device reports as its total (free = total - allocated).
std::atomic<int64_t> g_total_memory{int64_t(16) << 30};

void child_after_fork() {
  // What CUDA does: a child forked after the parent initialised the device can not use it.
  if (g_initialized.load()) {
    g_in_bad_fork = true;
    g_initialized = false;
  }
}

void lazy_init() {
  TORCH_CHECK(
      !g_in_bad_fork.load(),
      "Cannot re-initialize the emulated device in a forked subprocess: the parent process had"
      " already initialised it. Use the 'spawn' start method, or do not touch the device in the"
      " parent before forking.");
  if (!g_initialized.exchange(true)) {
    g_count_frozen = true;
  }
}

DeviceIndex device_count() {
  return static_cast<DeviceIndex>(g_device_count.load());
}

void check_index(DeviceIndex index) {
  TORCH_CHECK(
      index >= 0 && index < device_count(),
      "Invalid emulated device index ", static_cast<int>(index), ": this process has ",
      static_cast<int>(device_count()), " emulated device(s).");
}

DeviceIndex current_device() {
  return t_current_device;
}

void set_device(DeviceIndex index) {
  check_index(index);
  if (index != t_current_device) {
    lazy_init();
  }
  t_current_device = index;
}

// ---------------------------------------------------------------- allocator

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatType;

constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);
constexpr size_t kLarge = static_cast<size_t>(StatType::LARGE_POOL);

struct Block {
  size_t size;
  DeviceIndex device;
};

// c10::DeviceAllocator (what torch.accelerator's memory calls reach) arrived in torch 2.9; on older
// torch the allocator is a plain c10::Allocator and the same methods are reached only through this
// extension's own Python functions (the device module), as with a vendor plugin of that time.
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 9)
#define EMU_TORCH_2_9 1
#define EMU_DEVICE_ALLOCATOR_OVERRIDE override
using EmulatorAllocatorBase = c10::DeviceAllocator;
#else
#define EMU_TORCH_2_9 0
#define EMU_DEVICE_ALLOCATOR_OVERRIDE
using EmulatorAllocatorBase = c10::Allocator;
#endif

class EmulatorAllocator final : public EmulatorAllocatorBase {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    lazy_init();
    const DeviceIndex device = current_device();
    const c10::Device dev(g_type, device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &noop_delete, dev};
    }
    void* ptr = std::aligned_alloc(64, (nbytes + 63) / 64 * 64);
    TORCH_CHECK(ptr != nullptr, "emulated device out of host memory allocating ", nbytes, " bytes");
    {
      std::lock_guard<std::mutex> lock(mutex_);
      blocks_[ptr] = Block{nbytes, device};
      DeviceStats& s = stats_[device];
      for (size_t t : {kAggregate, kLarge}) {
        s.allocation[t].increase(1);
        s.segment[t].increase(1);
        s.active[t].increase(1);
        s.allocated_bytes[t].increase(nbytes);
        s.reserved_bytes[t].increase(nbytes);
        s.active_bytes[t].increase(nbytes);
        s.requested_bytes[t].increase(nbytes);
      }
      s.num_device_alloc += 1;
    }
    return {ptr, ptr, &delete_block, dev};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &delete_block;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }

  bool initialized() EMU_DEVICE_ALLOCATOR_OVERRIDE {
    return g_initialized.load();
  }

#if EMU_TORCH_2_9
  void emptyCache(c10::MempoolId_t) override {}  // nothing is cached

  void recordStream(const c10::DataPtr&, c10::Stream) override {}  // one synchronous queue
#endif

  DeviceStats getDeviceStats(DeviceIndex device) EMU_DEVICE_ALLOCATOR_OVERRIDE {
    check_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    return stats_[device];
  }

  void resetAccumulatedStats(DeviceIndex device) EMU_DEVICE_ALLOCATOR_OVERRIDE {
    check_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& s = stats_[device];
    for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes,
                      &s.active_bytes, &s.requested_bytes}) {
      for (auto& stat : *arr) stat.reset_accumulated();
    }
    s.num_device_alloc = 0;
    s.num_device_free = 0;
  }

  void resetPeakStats(DeviceIndex device) EMU_DEVICE_ALLOCATOR_OVERRIDE {
    check_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    DeviceStats& s = stats_[device];
    for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes,
                      &s.active_bytes, &s.requested_bytes}) {
      for (auto& stat : *arr) stat.reset_peak();
    }
  }

  std::pair<size_t, size_t> getMemoryInfo(DeviceIndex device) EMU_DEVICE_ALLOCATOR_OVERRIDE {
    check_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t total = g_total_memory.load();
    const int64_t used = stats_[device].reserved_bytes[kAggregate].current;
    return {static_cast<size_t>(std::max<int64_t>(total - used, 0)), static_cast<size_t>(total)};
  }

  // The device a pointer (anywhere inside a live allocation) belongs to, or -1.
  DeviceIndex device_of(const void* p) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto* addr = static_cast<const char*>(p);
    for (const auto& [start, block] : blocks_) {
      const auto* begin = static_cast<const char*>(start);
      if (addr >= begin && addr < begin + block.size) return block.device;
    }
    return -1;
  }

 private:
  static void noop_delete(void*) {}

  static void delete_block(void* ptr);

  void release(void* ptr) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto it = blocks_.find(ptr);
      if (it != blocks_.end()) {
        const Block block = it->second;
        blocks_.erase(it);
        DeviceStats& s = stats_[block.device];
        for (size_t t : {kAggregate, kLarge}) {
          s.allocation[t].decrease(1);
          s.segment[t].decrease(1);
          s.active[t].decrease(1);
          s.allocated_bytes[t].decrease(block.size);
          s.reserved_bytes[t].decrease(block.size);
          s.active_bytes[t].decrease(block.size);
          s.requested_bytes[t].decrease(block.size);
        }
        s.num_device_free += 1;
      }
    }
    std::free(ptr);
  }

  std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  DeviceStats stats_[kMaxDevices];
};

EmulatorAllocator g_allocator;

void EmulatorAllocator::delete_block(void* ptr) {
  g_allocator.release(ptr);
}


// ---------------------------------------------------------------- device guard, streams, events

thread_local c10::StreamId t_current_stream[kMaxDevices] = {};
std::atomic<c10::StreamId> g_next_stream_id{1};

struct EmulatorGuardImpl final : public c10::impl::DeviceGuardImplInterface {
  DeviceType type() const override {
    return g_type;
  }
  c10::Device exchangeDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == g_type, "expected an emulated device, got ", d);
    const DeviceIndex old = current_device();
    if (d.has_index() && d.index() != old) set_device(d.index());
    return c10::Device(g_type, old);
  }
  c10::Device getDevice() const override {
    return c10::Device(g_type, current_device());
  }
  void setDevice(c10::Device d) const override {
    TORCH_CHECK(d.type() == g_type, "expected an emulated device, got ", d);
    if (d.has_index()) set_device(d.index());
  }
  void uncheckedSetDevice(c10::Device d) const noexcept override {
    if (d.has_index() && d.index() >= 0 && d.index() < device_count()) t_current_device = d.index();
  }
  c10::Stream getStream(c10::Device d) const override {
    const DeviceIndex index = d.has_index() ? d.index() : current_device();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(g_type, index),
                       t_current_stream[index]);
  }
  c10::Stream getDefaultStream(c10::Device d) const override {
    const DeviceIndex index = d.has_index() ? d.index() : current_device();
    return c10::Stream(c10::Stream::DEFAULT, c10::Device(g_type, index));
  }
  c10::Stream getNewStream(c10::Device d, int) const override {
    const DeviceIndex index = d.has_index() ? d.index() : current_device();
    return c10::Stream(c10::Stream::UNSAFE, c10::Device(g_type, index),
                       g_next_stream_id.fetch_add(1));
  }
  c10::Stream getStreamFromGlobalPool(c10::Device d, bool) const override {
    return getNewStream(d, 0);
  }
  c10::Stream exchangeStream(c10::Stream s) const override {
    const DeviceIndex index = s.device_index();
    const c10::Stream old = getStream(s.device());
    t_current_stream[index] = s.id();
    return old;
  }
  // Every kernel finishes before it returns, so events are markers that are always complete.
  void destroyEvent(void* event, const DeviceIndex) const noexcept override {
    delete static_cast<int*>(event);
  }
  void record(void** event, const c10::Stream&, const DeviceIndex, const c10::EventFlag) const override {
    if (*event == nullptr) *event = new int(1);
  }
  void block(void*, const c10::Stream&) const override {}
  bool queryEvent(void*) const override {
    return true;
  }
  DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  bool queryStream(const c10::Stream&) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream&) const override {}
  void synchronizeEvent(void*) const override {}
  void synchronizeDevice(const DeviceIndex) const override {}
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void*, void*, const DeviceIndex) const override {
    return 0.0;
  }
};


// ---------------------------------------------------------------- generators

// A device generator is a CPU Philox/MT generator that says it belongs to an emulated device.
// The CPU fallback hands it to CPU kernels (see with_cpu_generator), so seeding the device
// really determines what random kernels on the device produce.
class EmulatorGenerator : public at::CPUGeneratorImpl {
 public:
  explicit EmulatorGenerator(DeviceIndex index) : at::CPUGeneratorImpl(c10::default_rng_seed_val) {
    device_ = c10::Device(g_type, index);
    key_set_ = c10::DispatchKeySet(g_key);
  }
  void present_as(DeviceType type, DeviceIndex index) {
    device_ = c10::Device(type, type == DeviceType::CPU ? DeviceIndex(-1) : index);
  }

 private:
  EmulatorGenerator* clone_impl() const override {
    auto* gen = new EmulatorGenerator(device_.index());
    gen->set_state(*this->get_state());
    return gen;
  }
};

std::vector<at::Generator>& default_generators() {
  static std::vector<at::Generator> gens = [] {
    std::vector<at::Generator> v;
    for (DeviceIndex i = 0; i < kMaxDevices; ++i) v.push_back(at::make_generator<EmulatorGenerator>(i));
    return v;
  }();
  return gens;
}

const at::Generator& default_generator(DeviceIndex index) {
  if (index < 0) index = current_device();
  check_index(index);
  return default_generators()[index];
}

// ---------------------------------------------------------------- hooks

// What ATen asks an accelerator's hooks (lazy init, device count, generators, pointers). One
// template serves the three hook interfaces: PrivateUse1HooksInterface (registered with
// at::RegisterPrivateUse1HooksInterface), XPUHooksInterface and HPUHooksInterface (registered in
// torch's XPUHooksRegistry / HPUHooksRegistry, which is how torch's own XPU build and Habana's
// bridge provide them). at::accelerator::getAccelerator() asks these hooks' isBuilt().
template <class Base>
struct EmulatorHooks : public Base {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  bool hasPrimaryContext(DeviceIndex) const override {
    return g_initialized.load();
  }
  void init() const override {
    lazy_init();
  }
  DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(DeviceIndex d) const override {
    set_device(d);
  }
  DeviceIndex getCurrentDevice() const override {
    return current_device();
  }
  DeviceIndex exchangeDevice(DeviceIndex d) const override {
    const DeviceIndex old = current_device();
    set_device(d);
    return old;
  }
  DeviceIndex maybeExchangeDevice(DeviceIndex d) const override {
    return exchangeDevice(d);
  }
  const at::Generator& getDefaultGenerator(DeviceIndex index) const override {
    return default_generator(index);
  }
  at::Generator getNewGenerator(DeviceIndex index) const override {
    return at::make_generator<EmulatorGenerator>(index < 0 ? current_device() : index);
  }
  at::Device getDeviceFromPtr(void* data) const override {
    const DeviceIndex index = g_allocator.device_of(data);
    TORCH_CHECK(index >= 0, "pointer ", data, " is not emulated device memory");
    return at::Device(g_type, index);
  }
  bool isPinnedPtr(const void*) const override {
    return false;
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return at::getCPUAllocator();
  }
};

struct PrivateUse1Hooks final : public EmulatorHooks<at::PrivateUse1HooksInterface> {
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t newsize) const override {
    auto* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
    const size_t old = impl->nbytes();
    c10::DeviceGuard guard(impl->device());
    at::DataPtr fresh = g_allocator.allocate(newsize);
    if (old > 0 && newsize > 0 && impl->data() != nullptr) {
      std::memcpy(fresh.get(), impl->data(), std::min(old, newsize));
    }
    impl->set_data_ptr_noswap(std::move(fresh));
    impl->set_nbytes(newsize);
  }
};

struct XPUHooks final : public EmulatorHooks<at::XPUHooksInterface> {
  bool hasXPU() const override {
    return true;
  }
  std::string showConfig() const override {
    return "Emulated XPU (tests/emulator): host memory, CPU kernels\n";
  }
  int32_t getGlobalIdxFromDevice(const at::Device& device) const override {
    return device.index();
  }
  DeviceIndex getNumGPUs() const override {
    return device_count();
  }
  DeviceIndex current_device() const override {
    return emulator::current_device();
  }
  void deviceSynchronize(DeviceIndex) const override {}  // every kernel has finished
};

struct HPUHooks final : public EmulatorHooks<at::HPUHooksInterface> {
  bool hasHPU() const override {
    return true;
  }
};

// ---------------------------------------------------------------- kernels

at::Tensor empty_memory_format(
    c10::IntArrayRef size, std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
    std::optional<c10::Device> device, std::optional<bool> pin_memory,
    std::optional<c10::MemoryFormat> memory_format) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "the emulated device supports strided tensors only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "pinned memory lives on the CPU");
  const c10::DeviceGuard guard(dev);
  return at::detail::empty_generic(size, &g_allocator, c10::DispatchKeySet(g_key),
                                   c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(
    c10::IntArrayRef size, c10::IntArrayRef stride, std::optional<c10::ScalarType> dtype,
    std::optional<c10::Layout> layout, std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  const auto dev = c10::device_or_default(device);
  TORCH_CHECK(c10::layout_or_default(layout) == c10::Layout::Strided,
              "the emulated device supports strided tensors only");
  TORCH_CHECK(!c10::pinned_memory_or_default(pin_memory), "pinned memory lives on the CPU");
  const c10::DeviceGuard guard(dev);
  return at::detail::empty_strided_generic(size, stride, &g_allocator,
                                           c10::DispatchKeySet(g_key),
                                           c10::dtype_or_default(dtype));
}

at::Tensor as_cpu(const at::Tensor& t) {
  return at::from_blob(t.data_ptr(), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "copy between undefined tensors");
  if (self.numel() == 0) return dst;
  if (self.is_cpu()) {
    at::Tensor dst_cpu = as_cpu(dst);
    at::native::copy_(dst_cpu, self, non_blocking);
  } else if (dst.is_cpu()) {
    at::Tensor dst_cpu = dst;
    at::native::copy_(dst_cpu, as_cpu(self), non_blocking);
  } else {  // device to device, same or different index: both are host memory
    at::Tensor dst_cpu = as_cpu(dst);
    at::native::copy_(dst_cpu, as_cpu(self), non_blocking);
  }
  return dst;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  at::native::resize_(dst, self.sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  return at::native::resize_(self, C10_AS_INTARRAYREF_SLOW(size), memory_format);
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor unfold(const at::Tensor& self, int64_t dimension, int64_t size, int64_t step) {
  return at::native::unfold(self, dimension, size, step);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return at::native::_local_scalar_dense_cpu(self);
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return at::native::set_tensor_(self, source);
}

at::Tensor& set_source_storage(at::Tensor& self, at::Storage source) {
  return at::native::set_(self, source);
}

at::Tensor& set_source_storage_offset(at::Tensor& self, at::Storage storage, int64_t offset,
                                      c10::IntArrayRef size, c10::IntArrayRef stride) {
  return at::cpu::set_(self, storage, offset, size, stride);
}

void record_stream(at::Tensor&, c10::Stream) {}  // one synchronous queue per device

// `param.data = param.to(device)` keeps the Parameter object only when the two tensors are
// "shallow-copy compatible"; torch's built-in list has no PrivateUse1, so without this
// Module.to() would make new Parameters and an optimizer created before the move (Fabric's
// setup(model, optimizer)) would step stale CPU tensors. Vendors register this, as we do.
bool has_compatible_shallow_copy_type(const at::Tensor& self, const at::Tensor& from) {
  auto dense = [](const at::Tensor& t) {
    return t.layout() == at::kStrided && (t.is_cpu() || t.device().type() == g_type);
  };
  return dense(self) && dense(from);
}

// ---------------------------------------------------------------- CPU fallback

// Device memory is host memory, so a CPU tensor over the same bytes *is* the device tensor.
at::Tensor alias_cpu(const at::Tensor& t) {
  if (t.numel() == 0 || t.data_ptr() == nullptr) return at::empty(t.sizes(), t.options().device(at::kCPU));
  return as_cpu(t);
}

bool has_written_argument(const c10::FunctionSchema& schema) {
  for (const auto& arg : schema.arguments()) {
    if (arg.alias_info() != nullptr && arg.alias_info()->isWrite()) return true;
  }
  return false;
}

// The device tensors an operator's arguments held, by the address their CPU aliases start at.
struct Aliases {
  std::vector<std::pair<const void*, at::Tensor>> originals;
  std::optional<c10::Device> device;

  at::Tensor alias(const at::Tensor& t) {
    if (!device) device = t.device();
    at::Tensor cpu = alias_cpu(t);
    if (cpu.numel() > 0) originals.emplace_back(cpu.storage().data(), t);
    return cpu;
  }

  // A CPU result of the CPU kernel, as a device tensor: a view of a device argument stays a
  // view of it (same memory), anything else is copied to the device.
  at::Tensor to_device(const at::Tensor& t) const {
    if (!t.defined() || !device || t.device().type() != DeviceType::CPU) return t;
    if (t.numel() > 0 && t.has_storage()) {
      const void* base = t.storage().data();
      for (const auto& [start, original] : originals) {
        if (start == base && t.dtype() == original.dtype()) {
          return at::cpu::as_strided(original, t.sizes(), t.strides(),
                                     original.storage_offset() + t.storage_offset());
        }
      }
    }
    return t.to(*device);
  }

  c10::IValue to_device(const c10::IValue& iv) const {
    if (iv.isTensor()) return to_device(iv.toTensor());
    if (iv.isTensorList()) {
      c10::List<at::Tensor> out;
      for (const at::Tensor& t : iv.toTensorList()) out.push_back(to_device(t));
      return out;
    }
    return iv;
  }
};

// Every device tensor among the arguments the schema does not mark as written (tensors, lists
// of tensors, optional tensors) becomes a CPU alias of the same memory: no copy, and what a CPU
// kernel mutates without saying so in its schema (native_batch_norm's running_mean/running_var)
// lands in device memory. Written arguments (in-place and out= ops) go through ATen's CPU
// fallback, which copies them to the CPU, runs the kernel, copies them back (resizing out=
// tensors) and returns the original device tensors.
void run_on_cpu(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto num_args = schema.arguments().size();
  const auto base = stack->size() - num_args;
  const bool writes = has_written_argument(schema);
  Aliases aliases;
  for (size_t i = 0; i < num_args; ++i) {
    const auto* alias_info = schema.arguments()[i].alias_info();
    if (alias_info != nullptr && alias_info->isWrite()) continue;
    c10::IValue& iv = (*stack)[base + i];
    if (iv.isTensor()) {
      if (on_device(iv.toTensor())) iv = aliases.alias(iv.toTensor());
    } else if (iv.isList()) {
      auto list = iv.toList();
      bool any = false;
      for (size_t j = 0; j < list.size(); ++j) {
        const c10::IValue element = list.get(j);
        any = any || (element.isTensor() && on_device(element.toTensor()));
      }
      if (!any) continue;
      auto copy = list.copy();  // the caller's list stays as it was
      for (size_t j = 0; j < copy.size(); ++j) {
        const c10::IValue element = copy.get(j);
        if (element.isTensor() && on_device(element.toTensor())) copy.set(j, aliases.alias(element.toTensor()));
      }
      iv = c10::IValue(copy);
    } else if (iv.isDevice() && iv.toDevice().type() == g_type) {
      if (!aliases.device) aliases.device = iv.toDevice();
      iv = c10::IValue(c10::Device(DeviceType::CPU));
    }
  }
  if (writes) {
    at::native::cpu_fallback(op, stack);
  } else {
    op.redispatchBoxed(c10::DispatchKeySet(c10::DispatchKey::CPU), stack);
  }
  const auto num_returns = schema.returns().size();
  const auto rbase = stack->size() - num_returns;
  for (size_t i = 0; i < num_returns; ++i) {
    c10::IValue& iv = (*stack)[rbase + i];
    iv = aliases.to_device(iv);
  }
}

// Replace every generator argument (given, or the device default when absent) by the device's
// generator presented as a CPU generator, so CPU random kernels draw from the device's state.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto num_args = schema.arguments().size();
  const auto base = stack->size() - num_args;
  std::vector<std::pair<EmulatorGenerator*, DeviceIndex>> presented;
  DeviceIndex device = current_device();
  for (size_t i = 0; i < num_args; ++i) {
    const auto& iv = (*stack)[base + i];
    if (iv.isTensor() && on_device(iv.toTensor())) {
      device = iv.toTensor().device().index();
      break;
    }
  }
  for (size_t i = 0; i < num_args; ++i) {
    const auto& arg = schema.arguments()[i];
    const auto& type = arg.real_type();
    const bool is_generator = type->kind() == c10::TypeKind::GeneratorType ||
        (type->kind() == c10::TypeKind::OptionalType &&
         type->castRaw<c10::OptionalType>()->getElementType()->kind() == c10::TypeKind::GeneratorType);
    if (!is_generator) continue;
    c10::IValue& iv = (*stack)[base + i];
    at::Generator gen = iv.isNone() ? default_generator(device) : iv.toGenerator();
    if (gen.device().type() == g_type) {
      auto* impl = gen.get<EmulatorGenerator>();
      presented.emplace_back(impl, gen.device().index());
      impl->present_as(DeviceType::CPU, -1);
      iv = c10::IValue(gen);
    }
  }
  auto restore = [&presented] {
    for (auto& [impl, index] : presented) impl->present_as(g_type, index);
  };
  try {
    run_on_cpu(op, stack);
  } catch (...) {
    restore();
    throw;
  }
  restore();
}

// torch's copy_ handles XPU tensors itself (XPU is one of the device types
// aten/src/ATen/native/Copy.cpp copies, through copy_stub's XPU slot) instead of calling
// _copy_from as it does for PrivateUse1 and HPU; a CPU build has no XPU slot, so XPU registers
// copy_ itself: both sides are host memory (src broadcasts to self as in torch's copy_).
at::Tensor& copy_(at::Tensor& self, const at::Tensor& src, bool non_blocking) {
  copy_from(src, self, non_blocking);
  return self;
}

// ---------------------------------------------------------------- autocast

// Ops autocast casts on this device type: matrix products and convolutions run in the lower
// precision, numerically sensitive ops in float32 (a subset of CUDA's lists). torch registers
// such lists itself for AutocastXPU, so XPU uses torch's own.
template <DeviceType T>
void register_autocast(torch::Library& m) {
  KERNEL(T, _convolution, deprecated, lower_precision_fp)
  KERNEL(T, _convolution, lower_precision_fp)
  KERNEL(T, conv1d, lower_precision_fp)
  KERNEL(T, conv2d, lower_precision_fp)
  KERNEL(T, conv3d, lower_precision_fp)
  KERNEL(T, conv1d, padding, lower_precision_fp)
  KERNEL(T, conv2d, padding, lower_precision_fp)
  KERNEL(T, conv3d, padding, lower_precision_fp)
  KERNEL(T, conv_transpose1d, lower_precision_fp)
  KERNEL(T, conv_transpose2d, input, lower_precision_fp)
  KERNEL(T, conv_transpose3d, input, lower_precision_fp)
  KERNEL(T, convolution, lower_precision_fp)
  KERNEL(T, addmm, lower_precision_fp)
  KERNEL(T, addmv, lower_precision_fp)
  KERNEL(T, addr, lower_precision_fp)
  KERNEL(T, matmul, lower_precision_fp)
  KERNEL(T, einsum, lower_precision_fp)
  KERNEL(T, mm, lower_precision_fp)
  KERNEL(T, mv, lower_precision_fp)
  KERNEL(T, linear, lower_precision_fp)
  KERNEL(T, addbmm, lower_precision_fp)
  KERNEL(T, baddbmm, lower_precision_fp)
  KERNEL(T, bmm, lower_precision_fp)
  KERNEL(T, prelu, lower_precision_fp)
  KERNEL(T, acos, fp32)
  KERNEL(T, asin, fp32)
  KERNEL(T, cosh, fp32)
  KERNEL(T, erfinv, fp32)
  KERNEL(T, exp, fp32)
  KERNEL(T, expm1, fp32)
  KERNEL(T, log, fp32)
  KERNEL(T, log10, fp32)
  KERNEL(T, log2, fp32)
  KERNEL(T, log1p, fp32)
  KERNEL(T, reciprocal, fp32)
  KERNEL(T, rsqrt, fp32)
  KERNEL(T, sinh, fp32)
  KERNEL(T, tan, fp32)
  KERNEL(T, softplus, fp32)
  KERNEL(T, layer_norm, fp32)
  KERNEL(T, group_norm, fp32)
  KERNEL(T, cosine_similarity, fp32)
  KERNEL(T, nll_loss, fp32)
  KERNEL(T, nll_loss2d, fp32)
  KERNEL(T, kl_div, fp32)
  KERNEL(T, l1_loss, fp32)
  KERNEL(T, smooth_l1_loss, fp32)
  KERNEL(T, huber_loss, fp32)
  KERNEL(T, mse_loss, fp32)
  KERNEL(T, binary_cross_entropy_with_logits, fp32)
  KERNEL(T, cdist, fp32)
  KERNEL(T, cross_entropy_loss, fp32)
  KERNEL(T, softmax, int, fp32)
  KERNEL(T, log_softmax, int, fp32)
  KERNEL(T, sum, fp32)
  KERNEL(T, cumsum, fp32)
  KERNEL(T, logsumexp, fp32)
  KERNEL(T, norm, Scalar, fp32)
}

// ---------------------------------------------------------------- registration for the chosen type

std::vector<std::unique_ptr<torch::Library>>& libraries() {
  static std::vector<std::unique_ptr<torch::Library>> libs;
  return libs;
}

torch::Library& library(const char* ns, c10::DispatchKey key) {
  libraries().push_back(std::make_unique<torch::Library>(torch::Library::IMPL, ns, key, __FILE__, __LINE__));
  return *libraries().back();
}

void register_kernels() {
  auto& m = library("aten", g_key);
  m.impl("empty.memory_format", empty_memory_format);
  m.impl("empty_strided", empty_strided);
  m.impl("as_strided", as_strided);
  m.impl("resize_", resize_);
  m.impl("_reshape_alias", reshape_alias);
  m.impl("_copy_from", copy_from);
  m.impl("_copy_from_and_resize", copy_from_and_resize);
  m.impl("_local_scalar_dense", local_scalar_dense);
  m.impl("set_.source_Tensor", set_source_tensor);
  m.impl("set_.source_Storage", set_source_storage);
  m.impl("set_.source_Storage_storage_offset", set_source_storage_offset);
  m.impl("view", view);
  m.impl("unfold", unfold);
  m.impl("record_stream", record_stream);
  m.impl("_has_compatible_shallow_copy_type", has_compatible_shallow_copy_type);
  // Structured ops whose composite (non-functional) form would resize a 0-d `out` tensor in the
  // CPU kernel and warn: send the functional op itself to the CPU fallback.
  m.impl("mse_loss", torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
  // Convolutions: for backends other than CPU/CUDA the composite kernels call
  // convolution_overrideable, which has no CPU kernel; run the CPU convolution instead.
  m.impl("convolution", torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
  m.impl("convolution_backward", torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
  library("_", g_key).fallback(torch::CppFunction::makeFromBoxedFunction<&cpu_fallback>());
}

#if !EMU_TORCH_2_9
// torch < 2.9 has no fallback for AutogradPrivateUse1: an op without an autograd kernel of its own
// (FSDP2's fsdp::all_gather_copy_in; a composite op this backend overrides, such as
// _has_compatible_shallow_copy_type in Module.to) fails with "Could not run ... from the
// 'Autograd<device>' backend". Fall through to the device's kernel (docs/limitations.md).
TORCH_LIBRARY_IMPL(_, AutogradPrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFallthrough());
}
#endif

// Make this process's emulated devices be of `type` ("privateuseone", "xpu" or "hpu"): the
// allocator, device guard, hooks, kernels, CPU fallback and autocast kernels of that type.
// Once per process; the Python side (tests/emulator/__init__.py) calls it before anything else.
void activate(const std::string& type) {
  static std::once_flag once;
  static std::string active;
  bool first = false;
  std::call_once(once, [&] {
    first = true;
    active = type;
    const DeviceType dt = c10::Device(type).type();
    TORCH_CHECK(dt == DeviceType::PrivateUse1 || dt == DeviceType::XPU || dt == DeviceType::HPU,
                "the emulator serves privateuseone, xpu or hpu, not ", type);
    g_type = dt;
    g_key = c10::computeDispatchKey(std::nullopt, std::nullopt, c10::Device(dt, 0));  // PrivateUse1/XPU/HPU
    c10::SetAllocator(dt, &g_allocator);
    static c10::impl::DeviceGuardImplRegistrar guard(dt, new EmulatorGuardImpl());
    register_kernels();
    if (dt == DeviceType::PrivateUse1) {
      at::RegisterPrivateUse1HooksInterface(new PrivateUse1Hooks());
      auto& fallthrough = library("_", c10::DispatchKey::AutocastPrivateUse1);
      fallthrough.fallback(torch::CppFunction::makeFallthrough());
      register_autocast<DeviceType::PrivateUse1>(library("aten", c10::DispatchKey::AutocastPrivateUse1));
    } else if (dt == DeviceType::XPU) {
      // The creator takes no argument (torch >= 2.9) or an XPUHooksArgs (2.8): accept either.
      at::XPUHooksRegistry()->Register(
          "XPUHooks", [](auto&&...) -> std::unique_ptr<at::XPUHooksInterface> { return std::make_unique<XPUHooks>(); });
      library("aten", g_key).impl("copy_", copy_);
    } else {
      at::HPUHooksRegistry()->Register(
          "HPUHooks", [](auto&&...) -> std::unique_ptr<at::HPUHooksInterface> {
            return std::make_unique<HPUHooks>();
          });
      library("_", c10::DispatchKey::AutocastHPU).fallback(torch::CppFunction::makeFallthrough());
      register_autocast<DeviceType::HPU>(library("aten", c10::DispatchKey::AutocastHPU));
    }
  });
  TORCH_CHECK(first || active == type, "the emulator already serves ", active, " in this process; it can not also serve ", type);
}

// ---------------------------------------------------------------- registration and Python API


void set_device_count(int count) {
  TORCH_CHECK(count >= 1 && count <= kMaxDevices, "device count must be in [1, ", kMaxDevices, "]");
  TORCH_CHECK(!g_count_frozen.load() || count == g_device_count.load(),
              "the emulated device count can not change after the device was initialised");
  g_device_count = count;
}

py::dict memory_stats(DeviceIndex device) {
  const DeviceStats s = g_allocator.getDeviceStats(device);
  py::dict out;
  auto add = [&](const std::string& name, const c10::CachingAllocator::StatArray& arr) {
    const auto& st = arr[kAggregate];
    out[py::str(name + ".all.current")] = st.current;
    out[py::str(name + ".all.peak")] = st.peak;
    out[py::str(name + ".all.allocated")] = st.allocated;
    out[py::str(name + ".all.freed")] = st.freed;
  };
  add("allocation", s.allocation);
  add("segment", s.segment);
  add("active", s.active);
  add("allocated_bytes", s.allocated_bytes);
  add("reserved_bytes", s.reserved_bytes);
  add("active_bytes", s.active_bytes);
  add("requested_bytes", s.requested_bytes);
  out["num_device_alloc"] = s.num_device_alloc;
  out["num_device_free"] = s.num_device_free;
  out["num_alloc_retries"] = s.num_alloc_retries;
  out["num_ooms"] = s.num_ooms;
  return out;
}

}  // namespace emulator

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  using namespace emulator;
  static const int registered = [] {
    pthread_atfork(nullptr, nullptr, &child_after_fork);
    return 1;
  }();
  (void)registered;
  m.def("activate", &activate, "Serve this device type (privateuseone, xpu, hpu); once per process.");
  m.def("device_type", [] { return c10::DeviceTypeName(g_type, /*lower_case=*/true); });
  m.def("set_device_count", &set_device_count, "Number of emulated devices (before first use).");
  m.def("device_count", [] { return static_cast<int>(device_count()); });
  m.def("current_device", [] { return static_cast<int>(current_device()); });
  m.def("set_device", [](int index) { set_device(static_cast<DeviceIndex>(index)); });
  m.def("init", &lazy_init, "Initialise the device (what the first allocation does).");
  m.def("is_initialized", [] { return g_initialized.load(); });
  m.def("is_in_bad_fork", [] { return g_in_bad_fork.load(); });
  m.def("memory_stats", [](int d) { return memory_stats(static_cast<DeviceIndex>(d)); });
  m.def("reset_peak_memory_stats", [](int d) { g_allocator.resetPeakStats(static_cast<DeviceIndex>(d)); });
  m.def("reset_accumulated_memory_stats",
        [](int d) { g_allocator.resetAccumulatedStats(static_cast<DeviceIndex>(d)); });
  m.def("mem_get_info", [](int d) { return g_allocator.getMemoryInfo(static_cast<DeviceIndex>(d)); });
  m.def("set_total_memory", [](int64_t bytes) { g_total_memory = bytes; });
  m.def("default_generator", [](int d) { return default_generator(static_cast<DeviceIndex>(d)); });
}
