// An emulated accelerator: a PrivateUse1 (or XPU, HPU) backend whose compute runs CPU kernels
// through a boxed fallback, and which is as strict as a discrete device where a test can tell:
// operands on another device are refused, device memory can not be read by the host except
// through copies, each device has a capacity past which allocation fails, and work on a side
// stream is visible to other streams only after they wait for it.
//
// It is test support for lightning-anyaccel, modelled on what out-of-tree vendors (torch_npu,
// torch_mlu, ...) register with PyTorch: a device guard with N devices, a caching allocator with
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
#include <ATen/core/op_registration/adaption.h>
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
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <iomanip>
#include <map>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace emulator {

// The device's activity for torch.profiler (profiler.cpp): whether a session records, and one
// kernel or copy with its start and end in nanoseconds since the epoch.
namespace profiling {
int64_t now_ns();
bool recording();
void record(const std::string& name, c10::DeviceIndex device, int64_t start_ns, int64_t end_ns, bool copy);
void register_profiler();
}  // namespace profiling

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

// ---------------------------------------------------------------- device memory

// Device memory the host can not read by accident, as on a discrete accelerator. Each device owns
// `capacity` bytes of address space, reserved PROT_NONE and never made accessible: the pointers
// tensors hold (data_ptr()) point there, so host code that dereferences one (ctypes or NumPy over
// data_ptr(), a CPU kernel handed device memory) faults, and the fault handler below names the
// cause. The same bytes are readable at a fixed offset in a second reservation (the alias), whose
// pages are made read-write segment by segment; only the emulator's own kernels and copies reach
// memory there, through host_ptr(). Neither reservation is committed memory until a segment is
// made read-write and touched, so the capacity (16 GiB per device by default) costs nothing.

constexpr size_t kPage = 4096;
constexpr size_t kMinBlock = 512;                // CUDA's caching allocator rounds to 512 bytes
constexpr size_t kSmallSize = size_t(1) << 20;   // blocks below 1 MiB are the small pool's
constexpr size_t kLargeSegment = size_t(2) << 20;  // large segments are multiples of 2 MiB

std::atomic<int64_t> g_capacity{int64_t(16) << 30};  // bytes per device
std::atomic<bool> g_memory_reserved{false};
char* g_device_base = nullptr;  // device 0's range; device i's starts at i * capacity
char* g_alias_base = nullptr;
size_t g_reserved_span = 0;     // capacity * device count
size_t g_device_capacity = 0;   // the capacity the ranges were reserved with

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

bool in_device_memory(const void* p) {
  const auto* c = static_cast<const char*>(p);
  return g_device_base != nullptr && c >= g_device_base && c < g_device_base + g_reserved_span;
}

// Where the emulator's kernels and copies read and write the bytes a device pointer names.
void* host_ptr(const void* p) {
  if (!in_device_memory(p)) return const_cast<void*>(p);  // nullptr, or memory that is not the device's
  return g_alias_base + (static_cast<const char*>(p) - g_device_base);
}

// A CPU tensor over the bytes of a device tensor: what the emulator's kernels and copies work on.
at::Tensor host_view(const at::Tensor& t) {
  return at::from_blob(host_ptr(t.data_ptr()), t.sizes(), t.strides(), t.options().device(at::kCPU));
}

// ----- the fault handler: a host access to device memory names its cause, then dies as it would have

struct sigaction g_previous_segv;
char g_fault_message[512];

void on_segv(int sig, siginfo_t* info, void* context) {
  if (info != nullptr && info->si_code > 0 && in_device_memory(info->si_addr)) {
    ssize_t ignored = write(STDERR_FILENO, g_fault_message, std::strlen(g_fault_message));
    (void)ignored;
  }
  sigaction(SIGSEGV, &g_previous_segv, nullptr);
  // A fault re-runs the faulting instruction under the previous handler when this one returns; a
  // signal sent by kill()/raise() is sent again.
  if (info == nullptr || info->si_code <= 0) raise(sig);
}

void install_fault_handler(const std::string& type_name) {
  std::snprintf(g_fault_message, sizeof g_fault_message,
                "\nFatal: the host read or wrote emulated %s device memory directly (a device tensor's"
                " data_ptr() dereferenced on the host: ctypes, NumPy, a CPU kernel). Device memory is"
                " not host memory: copy the tensor first (tensor.cpu(), tensor.to(\"cpu\")).\n",
                type_name.c_str());
  struct sigaction action {};
  action.sa_sigaction = &on_segv;
  action.sa_flags = SA_SIGINFO | SA_ONSTACK;
  sigemptyset(&action.sa_mask);
  sigaction(SIGSEGV, &action, &g_previous_segv);
}

// Reserve every device's range once, after the device count is fixed (the first allocation).
void reserve_device_memory() {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (g_memory_reserved.load()) return;
  const size_t capacity = static_cast<size_t>(g_capacity.load());
  const size_t span = capacity * static_cast<size_t>(device_count());
  void* device = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  TORCH_CHECK(device != MAP_FAILED, "emulated device: could not reserve ", span, " bytes of address space: ",
              std::strerror(errno));
  void* alias = mmap(nullptr, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (alias == MAP_FAILED) {
    munmap(device, span);
    TORCH_CHECK(false, "emulated device: could not reserve ", span, " bytes of address space: ", std::strerror(errno));
  }
  g_device_base = static_cast<char*>(device);
  g_alias_base = static_cast<char*>(alias);
  g_reserved_span = span;
  g_device_capacity = capacity;
  install_fault_handler(c10::DeviceTypeName(g_type, /*lower_case=*/true));
  g_memory_reserved = true;
}

std::string format_size(uint64_t bytes) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(2);
  if (bytes < (uint64_t(1) << 10)) {
    return std::to_string(bytes) + " bytes";
  } else if (bytes < (uint64_t(1) << 20)) {
    out << bytes / 1024.0 << " KiB";
  } else if (bytes < (uint64_t(1) << 30)) {
    out << bytes / 1048576.0 << " MiB";
  } else {
    out << bytes / 1073741824.0 << " GiB";
  }
  return out.str();
}

using c10::CachingDeviceAllocator::DeviceStats;
using c10::CachingAllocator::StatType;

constexpr size_t kAggregate = static_cast<size_t>(StatType::AGGREGATE);
constexpr size_t kSmallPool = static_cast<size_t>(StatType::SMALL_POOL);
constexpr size_t kLargePool = static_cast<size_t>(StatType::LARGE_POOL);

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

// A caching allocator, as CUDA's and the vendors' are. A segment (what a driver allocation would be)
// is carved out of the device's range and made read-write in the alias; a freed block keeps its
// segment, reserved and cached for a later allocation of a similar size; empty_cache() and an
// allocation that does not fit otherwise release cached segments (their pages go back to the
// host). Past the capacity, allocation raises torch.OutOfMemoryError with the vendor's message.
// Segments are not split, so fragmentation differs from a real device's.
class EmulatorAllocator final : public EmulatorAllocatorBase {
 public:
  c10::DataPtr allocate(size_t nbytes) override {
    lazy_init();
    reserve_device_memory();
    const DeviceIndex device = current_device();
    const c10::Device dev(g_type, device);
    if (nbytes == 0) {
      return {nullptr, nullptr, &noop_delete, dev};
    }
    const size_t block_size = round_up(nbytes, kMinBlock);
    std::lock_guard<std::mutex> lock(mutex_);
    Heap& heap = heaps_[device];
    DeviceStats& s = stats_[device];
    size_t offset = 0;
    size_t segment_size = 0;
    if (!take_cached(heap, block_size, &offset, &segment_size)) {
      segment_size = segment_size_for(block_size);
      if (!carve(heap, segment_size, &offset)) {
        s.num_alloc_retries += 1;
        release_cached(device);
        if (!carve(heap, segment_size, &offset)) {
          s.num_ooms += 1;
          out_of_memory(device, nbytes);
        }
      }
      char* alias = g_alias_base + device_offset(device) + offset;
      if (mprotect(alias, segment_size, PROT_READ | PROT_WRITE) != 0) {
        give_back(heap, offset, segment_size);
        s.num_ooms += 1;
        out_of_memory(device, nbytes, std::strerror(errno));
      }
      for (size_t t : {kAggregate, pool(segment_size)}) {
        s.segment[t].increase(1);
        s.reserved_bytes[t].increase(segment_size);
      }
      s.num_device_alloc += 1;
    }
    char* ptr = g_device_base + device_offset(device) + offset;
    blocks_[ptr] = Block{nbytes, block_size, segment_size, device};
    for (size_t t : {kAggregate, pool(block_size)}) {
      s.allocation[t].increase(1);
      s.active[t].increase(1);
      s.allocated_bytes[t].increase(block_size);
      s.active_bytes[t].increase(block_size);
      s.requested_bytes[t].increase(nbytes);
    }
    return {ptr, ptr, &delete_block, dev};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &delete_block;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(host_ptr(dest), host_ptr(src), count);
  }

  bool initialized() EMU_DEVICE_ALLOCATOR_OVERRIDE {
    return g_initialized.load();
  }

  // Every device's cached segments go back (CUDA's emptyCache releases them on every device too).
  void empty_cache() {
    std::lock_guard<std::mutex> lock(mutex_);
    for (DeviceIndex d = 0; d < device_count(); ++d) release_cached(d);
  }

#if EMU_TORCH_2_9
  void emptyCache(c10::MempoolId_t) override {
    empty_cache();
  }

  // Memory is released when its last tensor is, whatever stream used it (pending side-stream
  // results hold their tensors until they land; see the streams section).
  void recordStream(const c10::DataPtr&, c10::Stream) override {}
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
    for_each_stat(s, [](auto& stat) { stat.reset_accumulated(); });
    s.num_device_alloc = 0;
    s.num_device_free = 0;
    s.num_alloc_retries = 0;
    s.num_ooms = 0;
  }

  void resetPeakStats(DeviceIndex device) EMU_DEVICE_ALLOCATOR_OVERRIDE {
    check_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    for_each_stat(stats_[device], [](auto& stat) { stat.reset_peak(); });
  }

  // Every counter of a device's stats (each kind of allocation, per pool), for the resets above.
  template <typename F>
  static void for_each_stat(DeviceStats& s, F f) {
    for (auto* arr : {&s.allocation, &s.segment, &s.active, &s.allocated_bytes, &s.reserved_bytes,
                      &s.active_bytes, &s.requested_bytes}) {
      for (auto& stat : *arr) f(stat);
    }
  }

  // (free, total) as a driver reports them: what is not reserved by this process is free.
  std::pair<size_t, size_t> getMemoryInfo(DeviceIndex device) EMU_DEVICE_ALLOCATOR_OVERRIDE {
    check_index(device);
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t total = capacity();
    const int64_t used = stats_[device].reserved_bytes[kAggregate].current;
    return {static_cast<size_t>(std::max<int64_t>(total - used, 0)), static_cast<size_t>(total)};
  }

  // The device a pointer (anywhere in a device's range) belongs to, or -1.
  DeviceIndex device_of(const void* p) const {
    if (!in_device_memory(p)) return -1;
    return static_cast<DeviceIndex>((static_cast<const char*>(p) - g_device_base) / g_device_capacity);
  }

 private:
  struct Block {
    size_t requested;
    size_t size;          // rounded to kMinBlock: what allocated_bytes counts
    size_t segment_size;  // what reserved_bytes counts
    DeviceIndex device;
  };

  struct Heap {
    std::map<size_t, size_t> free;               // unreserved ranges: offset -> length (coalesced)
    std::multimap<size_t, size_t> cached;        // cached segments: length -> offset
    bool initialised = false;
  };

  static size_t capacity() {
    return g_memory_reserved.load() ? g_device_capacity : static_cast<size_t>(g_capacity.load());
  }

  static size_t device_offset(DeviceIndex device) {
    return static_cast<size_t>(device) * g_device_capacity;
  }

  static size_t pool(size_t block_size) {
    return block_size < kSmallSize ? kSmallPool : kLargePool;
  }

  static size_t segment_size_for(size_t block_size) {
    return round_up(block_size, block_size < kSmallSize ? kPage : kLargeSegment);
  }

  // A cached segment for a block: the smallest that fits, if it is less than twice what it takes.
  static bool take_cached(Heap& heap, size_t block_size, size_t* offset, size_t* segment_size) {
    auto it = heap.cached.lower_bound(block_size);
    if (it == heap.cached.end() || it->first >= 2 * segment_size_for(block_size)) return false;
    *segment_size = it->first;
    *offset = it->second;
    heap.cached.erase(it);
    return true;
  }

  // First fit in the device's unreserved ranges.
  bool carve(Heap& heap, size_t size, size_t* offset) const {
    if (!heap.initialised) {
      heap.free[0] = g_device_capacity;
      heap.initialised = true;
    }
    for (auto it = heap.free.begin(); it != heap.free.end(); ++it) {
      if (it->second < size) continue;
      *offset = it->first;
      const size_t rest = it->second - size;
      heap.free.erase(it);
      if (rest > 0) heap.free[*offset + size] = rest;
      return true;
    }
    return false;
  }

  static void give_back(Heap& heap, size_t offset, size_t size) {
    auto next = heap.free.lower_bound(offset);
    if (next != heap.free.end() && offset + size == next->first) {
      size += next->second;
      next = heap.free.erase(next);
    }
    if (next != heap.free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == offset) {
        prev->second += size;
        return;
      }
    }
    heap.free[offset] = size;
  }

  // Cached segments of a device go back to the host (mutex_ held).
  void release_cached(DeviceIndex device) {
    Heap& heap = heaps_[device];
    DeviceStats& s = stats_[device];
    for (const auto& [size, offset] : heap.cached) {
      char* alias = g_alias_base + device_offset(device) + offset;
      madvise(alias, size, MADV_DONTNEED);
      mprotect(alias, size, PROT_NONE);
      give_back(heap, offset, size);
      for (size_t t : {kAggregate, pool(size)}) {
        s.segment[t].decrease(1);
        s.reserved_bytes[t].decrease(size);
      }
      s.num_device_free += 1;
    }
    heap.cached.clear();
  }

  [[noreturn]] void out_of_memory(DeviceIndex device, size_t nbytes, const char* host_error = nullptr) {
    const DeviceStats& s = stats_[device];
    const int64_t allocated = s.allocated_bytes[kAggregate].current;
    const int64_t reserved = s.reserved_bytes[kAggregate].current;
    const std::string type = c10::DeviceTypeName(g_type, /*lower_case=*/false);
    std::ostringstream message;
    message << type << " out of memory. Tried to allocate " << format_size(nbytes) << ". " << type << " "
            << static_cast<int>(device) << " has a total capacity of " << format_size(capacity())
            << " of which " << format_size(std::max<int64_t>(capacity() - reserved, 0)) << " is free. Of the"
            << " allocated memory " << format_size(allocated) << " is allocated by PyTorch, and "
            << format_size(reserved - allocated) << " is reserved by PyTorch but unallocated.";
    if (host_error != nullptr) message << " (The host refused the memory: " << host_error << ".)";
    message << " (emulated device: capacity set by emulator.load(..., memory_bytes=N) or NAME:COUNT:memory=SIZE)";
    TORCH_CHECK_WITH(OutOfMemoryError, false, message.str());
  }

  static void noop_delete(void*) {}

  static void delete_block(void* ptr);

  void release(void* ptr) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) return;
    const Block block = it->second;
    blocks_.erase(it);
    DeviceStats& s = stats_[block.device];
    for (size_t t : {kAggregate, pool(block.size)}) {
      s.allocation[t].decrease(1);
      s.active[t].decrease(1);
      s.allocated_bytes[t].decrease(block.size);
      s.active_bytes[t].decrease(block.size);
      s.requested_bytes[t].decrease(block.requested);
    }
    const size_t offset = static_cast<char*>(ptr) - g_device_base - device_offset(block.device);
    heaps_[block.device].cached.emplace(block.segment_size, offset);
  }

  std::mutex mutex_;
  std::unordered_map<void*, Block> blocks_;
  Heap heaps_[kMaxDevices];
  DeviceStats stats_[kMaxDevices];
};

EmulatorAllocator g_allocator;

void EmulatorAllocator::delete_block(void* ptr) {
  g_allocator.release(ptr);
}


// ---------------------------------------------------------------- device guard, streams, events

// Streams order work as on a device: what runs on a side stream (any stream but the device's
// default one) is not visible to other streams until they wait for it. Kernels still run when they
// are called, but a result written while a side stream is current is *pending*: its bytes are
// kept aside and the device memory holds a poison pattern (NaN for floating types, all bits set
// otherwise) until a synchronisation makes it land: another stream waits for an event recorded
// after it (`wait_stream`, `wait_event`), the event or the stream is synchronised or queried, or
// the device is. So code that reads a side stream's result without waiting reads garbage, as it
// may on hardware. Work on a stream sees that stream's own pending results (they land when the
// stream runs its next kernel, which also makes them visible to the other streams: a missed wait
// shows for the side stream's latest results only). Events record the time they are recorded at,
// so `elapsed_time` measures.
//
// Gaudi is the exception: its runtime resolves data dependencies between streams itself (DeepSpeed's
// HPU accelerator says so, `resolves_data_dependency()`, and leaves out the waits it makes on every
// other device), so on the emulated `hpu` a side stream's results are visible at once.

thread_local c10::StreamId t_current_stream[kMaxDevices] = {};
std::atomic<c10::StreamId> g_next_stream_id{1};

struct PendingWrite {
  at::Tensor target;  // the device tensor (held: its memory stays allocated until the result lands)
  at::Tensor result;  // a host copy of the result
  uint64_t seq;
};

std::mutex g_pending_mutex;
std::map<std::pair<DeviceIndex, c10::StreamId>, std::deque<PendingWrite>> g_pending;
std::atomic<int64_t> g_pending_count{0};
std::atomic<uint64_t> g_pending_seq{0};
// Set while the CPU fallback runs an operator: its copies do not make the stream's results land.
thread_local bool t_in_operator = false;

// Whether the runtime orders streams by the data they use (Gaudi's), instead of by waits.
bool g_streams_resolve_dependencies = false;

bool on_side_stream(DeviceIndex device) {
  return device >= 0 && t_current_stream[device] != 0 && !g_streams_resolve_dependencies;
}

// A result just written on the current (side) stream: keep it aside, poison the device memory.
void defer_result(const at::Tensor& t) {
  if (!t.defined() || t.numel() == 0 || t.data_ptr() == nullptr) return;
  const DeviceIndex device = t.device().index();
  at::Tensor view = host_view(t);
  PendingWrite pending{t, view.clone(), 0};
  at::Tensor poison = at::empty_like(pending.result, at::MemoryFormat::Contiguous);
  std::memset(poison.data_ptr(), t.scalar_type() == at::kBool ? 0x01 : 0xFF, poison.nbytes());
  view.copy_(poison);
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  pending.seq = ++g_pending_seq;
  g_pending[{device, t_current_stream[device]}].push_back(std::move(pending));
  g_pending_count += 1;
}

// Results of `stream` written up to `seq` land in device memory, in the order they were written.
void land(DeviceIndex device, c10::StreamId stream, uint64_t seq = UINT64_MAX) {
  if (g_pending_count.load() == 0) return;
  std::lock_guard<std::mutex> lock(g_pending_mutex);
  auto it = g_pending.find({device, stream});
  if (it == g_pending.end()) return;
  auto& queue = it->second;
  while (!queue.empty() && queue.front().seq <= seq) {
    const PendingWrite& w = queue.front();
    host_view(w.target).copy_(w.result);
    queue.pop_front();
    g_pending_count -= 1;
  }
  if (queue.empty()) g_pending.erase(it);
}

void land_device(DeviceIndex device) {
  if (g_pending_count.load() == 0) return;
  std::vector<c10::StreamId> streams;
  {
    std::lock_guard<std::mutex> lock(g_pending_mutex);
    for (const auto& [key, queue] : g_pending) {
      if (key.first == device) streams.push_back(key.second);
    }
  }
  for (c10::StreamId s : streams) land(device, s);
}

// Before a kernel on a side stream: the stream's own earlier results are what it reads.
void before_kernel(DeviceIndex device) {
  if (on_side_stream(device)) land(device, t_current_stream[device]);
}

struct EmulatorEvent {
  DeviceIndex device = -1;
  c10::StreamId stream = 0;
  uint64_t seq = 0;
  bool timing = false;
  std::chrono::steady_clock::time_point time;
};

void land_event(void* event) {
  auto* e = static_cast<EmulatorEvent*>(event);
  if (e != nullptr && e->device >= 0) land(e->device, e->stream, e->seq);
}

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
  void destroyEvent(void* event, const DeviceIndex) const noexcept override {
    delete static_cast<EmulatorEvent*>(event);
  }
  void record(void** event, const c10::Stream& stream, const DeviceIndex, const c10::EventFlag flag) const override {
    if (*event == nullptr) {
      auto* e = new EmulatorEvent();
      e->timing = flag == c10::EventFlag::BACKEND_DEFAULT;
      *event = e;
    }
    auto* e = static_cast<EmulatorEvent*>(*event);
    e->device = stream.device_index();
    e->stream = stream.id();
    e->seq = g_pending_seq.load();
    e->time = std::chrono::steady_clock::now();
  }
  // The waiting stream sees what the event's stream wrote before the event.
  void block(void* event, const c10::Stream&) const override {
    land_event(event);
  }
  // Work completes when someone looks: a query makes the results land and reports them done.
  bool queryEvent(void* event) const override {
    land_event(event);
    return true;
  }
  DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  bool queryStream(const c10::Stream& stream) const override {
    land(stream.device_index(), stream.id());
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {
    land(stream.device_index(), stream.id());
  }
  void synchronizeEvent(void* event) const override {
    land_event(event);
  }
  void synchronizeDevice(const DeviceIndex index) const override {
    land_device(index < 0 ? current_device() : index);
  }
  void recordDataPtrOnStream(const c10::DataPtr&, const c10::Stream&) const override {}
  double elapsedTime(void* start, void* end, const DeviceIndex) const override {
    auto* a = static_cast<EmulatorEvent*>(start);
    auto* b = static_cast<EmulatorEvent*>(end);
    TORCH_CHECK(a != nullptr && b != nullptr && a->device >= 0 && b->device >= 0,
                "Both events must be recorded before calculating elapsed time.");
    TORCH_CHECK(a->timing && b->timing, "Both events must be created with argument 'enable_timing=True'.");
    land_event(end);
    return std::chrono::duration<double, std::milli>(b->time - a->time).count();
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
      std::memcpy(host_ptr(fresh.get()), host_ptr(impl->data()), std::min(old, newsize));
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
  void deviceSynchronize(DeviceIndex index) const override {
    land_device(index < 0 ? emulator::current_device() : index);
  }
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

// Copies between host and device, and between devices: through the alias of device memory. On a
// side stream the copy's result is pending until the stream is waited for (streams section).
at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.defined() && dst.defined(), "copy between undefined tensors");
  if (self.numel() == 0) return dst;
  const DeviceIndex stream_device = on_device(dst) ? dst.device().index() : self.device().index();
  if (!t_in_operator) before_kernel(stream_device);
  const bool profiled = !t_in_operator && profiling::recording();
  const int64_t start_ns = profiled ? profiling::now_ns() : 0;
  at::Tensor dst_host = on_device(dst) ? host_view(dst) : dst;
  at::native::copy_(dst_host, on_device(self) ? host_view(self) : self, non_blocking);
  if (profiled) {
    const char* kind = !on_device(self) ? "Memcpy HtoD" : !on_device(dst) ? "Memcpy DtoH" : "Memcpy DtoD";
    profiling::record(kind, stream_device, start_ns, profiling::now_ns(), /*copy=*/true);
  }
  if (on_device(dst) && on_side_stream(stream_device)) defer_result(dst);
  return dst;
}

// Grow a device storage to hold `nbytes` (torch's CPU resize would copy through device pointers).
void grow_storage(const at::Tensor& self, size_t nbytes) {
  auto* impl = self.storage().unsafeGetStorageImpl();
  if (nbytes <= impl->nbytes()) return;
  TORCH_CHECK(impl->resizable(), "Trying to resize storage that is not resizable");
  const c10::DeviceGuard guard(impl->device());
  at::DataPtr fresh = g_allocator.allocate(nbytes);
  if (impl->nbytes() > 0 && impl->data() != nullptr) {
    std::memcpy(host_ptr(fresh.get()), host_ptr(impl->data()), impl->nbytes());
  }
  impl->set_data_ptr_noswap(std::move(fresh));
  impl->set_nbytes(nbytes);
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<at::MemoryFormat> memory_format) {
  const c10::DeviceGuard guard(self.device());
  const auto sizes = C10_AS_INTARRAYREF_SLOW(size);
  const int64_t numel = c10::multiply_integers(sizes);
  if (numel > 0 && self.has_storage()) {
    grow_storage(self, static_cast<size_t>(numel + self.storage_offset()) * self.itemsize());
  }
  return at::native::resize_(self, sizes, memory_format);  // the storage is large enough: no copy there
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, c10::fromIntArrayRefSlow(self.sizes()), std::nullopt);
  return copy_from(self, dst, false);
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  return at::cpu::as_strided_symint(self, size, stride, std::move(storage_offset));
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
  before_kernel(self.device().index());
  return at::native::_local_scalar_dense_cpu(host_view(self));
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

void record_stream(at::Tensor&, c10::Stream) {}  // memory is freed with its last tensor (allocator)

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

// Device memory is host memory (at its alias), so a CPU tensor over the same bytes *is* the device tensor.
at::Tensor alias_cpu(const at::Tensor& t) {
  if (t.numel() == 0 || t.data_ptr() == nullptr) return at::empty(t.sizes(), t.options().device(at::kCPU));
  return host_view(t);
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

// ---------------------------------------------------------------- device checks

// Operands on another device are refused, as by the kernels of CUDA, XPU and the vendors' devices.
// torch's code generator gives every such kernel a check that all tensor arguments (out= and
// positional) are on one device, except the operators `native_functions.yaml` marks
// `device_check: NoCheck`, whose kernels check for themselves: TensorIterator accepts CPU scalars
// (0-dim tensors), index kernels take index tensors from any device (they move them), foreach
// kernels take their `scalars` on the CPU. The Python side hands over torch's own NoCheck list
// (set_unchecked_operators); until it does, every operator gets the lenient rule.
std::unordered_set<std::string> g_unchecked_ops;
std::atomic<bool> g_unchecked_ops_known{false};

struct DeviceRule {
  bool exact = false;    // the generated check: every tensor argument on one device, CPU scalars included
  bool foreach = false;  // _foreach_*: the tensors at each position of the lists on one device (CUDA's slow path)
  std::string method;    // where the message says the check failed, as torch's generated kernels name it
};

const DeviceRule& device_rule(const c10::OperatorHandle& op) {
  thread_local std::unordered_map<const c10::FunctionSchema*, DeviceRule> rules;
  const c10::FunctionSchema& schema = op.schema();
  auto found = rules.find(&schema);
  if (found != rules.end()) return found->second;
  std::string name = schema.name();
  const bool aten = name.rfind("aten::", 0) == 0;
  if (aten) name = name.substr(6);
  const std::string& overload = schema.overload_name();
  DeviceRule rule;
  rule.exact = aten && g_unchecked_ops_known.load() &&
      g_unchecked_ops.count(overload.empty() ? name : name + "." + overload) == 0;
  rule.foreach = aten && name.rfind("_foreach_", 0) == 0;
  rule.method = "wrapper_" + std::string(c10::toString(g_key)) + "_" + overload + "_" + name;
  return rules.emplace(&schema, std::move(rule)).first->second;
}

// Checks one operator's arguments; returns the device index it runs on (-1: none of its tensors is
// on the emulated device).
class DeviceCheck {
 public:
  DeviceCheck(const DeviceRule& rule) : rule_(rule) {}

  void visit(const at::Tensor& t, const c10::Argument& arg) {
    if (!t.defined()) return;
    if (device_ < 0 && on_device(t)) device_ = t.device().index();
    if (!rule_.exact && t.is_cpu() && t.dim() == 0) return;  // a CPU scalar, as TensorIterator takes it
    if (!common_) {
      common_ = t.device();
    } else if (*common_ != t.device()) {
      if (rule_.exact) {
        c10::impl::common_device_check_failure(*common_, t, rule_.method.c_str(), arg.name().c_str());
      }
      TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, ",
                  *common_, " and ", t.device(), "!");
    }
  }

  void reset() {
    common_.reset();
  }

  DeviceIndex device() const {
    return device_;
  }

 private:
  const DeviceRule& rule_;
  std::optional<c10::Device> common_;
  DeviceIndex device_ = -1;
};

// The arguments a kernel checks: out= arguments first, then the positional ones, as the generated
// check does; keyword-only inputs (a fused optimizer's `lr`, `found_inf`) are the kernel's business,
// and so are index tensors and foreach `scalars`.
bool checked_argument(const c10::Argument& arg) {
  const bool written = arg.alias_info() != nullptr && arg.alias_info()->isWrite();
  if (arg.kwarg_only() && !written) return false;
  return arg.name() != "indices" && arg.name() != "scalars";
}

void visit_value(DeviceCheck& check, const c10::IValue& iv, const c10::Argument& arg) {
  if (iv.isTensor()) {
    check.visit(iv.toTensor(), arg);
  } else if (iv.isTensorList()) {
    for (const at::Tensor& t : iv.toTensorList()) check.visit(t, arg);
  } else if (iv.isList()) {
    for (const c10::IValue& element : iv.toListRef()) {
      if (element.isTensor()) check.visit(element.toTensor(), arg);
    }
  }
}

DeviceIndex check_devices(const c10::OperatorHandle& op, const torch::jit::Stack& stack) {
  const auto& arguments = op.schema().arguments();
  const size_t base = stack.size() - arguments.size();
  const DeviceRule& rule = device_rule(op);
  DeviceCheck check(rule);
  if (rule.foreach) {
    size_t positions = 0;
    for (size_t i = 0; i < arguments.size(); ++i) {
      if (stack[base + i].isTensorList()) positions = std::max(positions, stack[base + i].toTensorList().size());
    }
    for (size_t p = 0; p < positions; ++p) {
      check.reset();
      for (size_t i = 0; i < arguments.size(); ++i) {
        if (!checked_argument(arguments[i])) continue;
        const c10::IValue& iv = stack[base + i];
        if (iv.isTensorList()) {
          const auto list = iv.toTensorList();
          if (p < list.size()) check.visit(list.get(p), arguments[i]);
        } else if (iv.isTensor()) {
          check.visit(iv.toTensor(), arguments[i]);
        }
      }
    }
    return check.device();
  }
  for (bool out : {true, false}) {
    for (size_t i = 0; i < arguments.size(); ++i) {
      const c10::Argument& arg = arguments[i];
      const bool is_out = arg.kwarg_only() && arg.alias_info() != nullptr && arg.alias_info()->isWrite();
      if (is_out != out || !checked_argument(arg)) continue;
      visit_value(check, stack[base + i], arg);
    }
  }
  return check.device();
}

// Replace every generator argument (given, or the device default when absent) by the device's
// generator presented as a CPU generator, so CPU random kernels draw from the device's state.
void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& schema = op.schema();
  const auto num_args = schema.arguments().size();
  const auto base = stack->size() - num_args;
  std::vector<std::pair<EmulatorGenerator*, DeviceIndex>> presented;
  DeviceIndex device = check_devices(op, *stack);
  if (device < 0) device = current_device();
  before_kernel(device);
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
  const bool outer = !t_in_operator;
  const bool profiled = outer && profiling::recording();
  const int64_t start_ns = profiled ? profiling::now_ns() : 0;
  t_in_operator = true;
  try {
    run_on_cpu(op, stack);
  } catch (...) {
    t_in_operator = !outer;
    restore();
    throw;
  }
  t_in_operator = !outer;
  restore();
  if (profiled) profiling::record("kernel: " + schema.name(), device, start_ns, profiling::now_ns(), /*copy=*/false);
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
    g_streams_resolve_dependencies = dt == DeviceType::HPU;
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

void set_memory_bytes(int64_t bytes) {
  TORCH_CHECK(bytes >= int64_t(kLargeSegment), "the emulated device capacity must be at least ", kLargeSegment, " bytes");
  TORCH_CHECK(!g_memory_reserved.load() || round_up(bytes, kLargeSegment) == g_device_capacity,
              "the emulated device capacity can not change after the first allocation");
  g_capacity = static_cast<int64_t>(round_up(static_cast<size_t>(bytes), kLargeSegment));
}

void set_unchecked_operators(const std::vector<std::string>& names) {
  g_unchecked_ops = std::unordered_set<std::string>(names.begin(), names.end());
  g_unchecked_ops_known = true;
}

py::dict memory_stats(DeviceIndex device) {
  const DeviceStats s = g_allocator.getDeviceStats(device);
  py::dict out;
  auto add = [&](const std::string& name, const c10::CachingAllocator::StatArray& arr) {
    for (const auto& [pool, index] : {std::pair<const char*, size_t>{"all", kAggregate},
                                      {"small_pool", kSmallPool}, {"large_pool", kLargePool}}) {
      const auto& st = arr[index];
      const std::string prefix = name + "." + pool + ".";
      out[py::str(prefix + "current")] = st.current;
      out[py::str(prefix + "peak")] = st.peak;
      out[py::str(prefix + "allocated")] = st.allocated;
      out[py::str(prefix + "freed")] = st.freed;
    }
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
  m.def("set_memory_bytes", &set_memory_bytes, "Capacity of each emulated device in bytes (before first use).");
  m.def("memory_bytes", [] { return g_memory_reserved.load() ? static_cast<int64_t>(g_device_capacity) : g_capacity.load(); });
  m.def("empty_cache", [] { g_allocator.empty_cache(); }, "Release every device's cached memory.");
  m.def("synchronize", [](int d) { land_device(static_cast<DeviceIndex>(d < 0 ? current_device() : d)); },
        "Wait for every stream of a device (side-stream results land).");
  m.def("set_unchecked_operators", &set_unchecked_operators,
        "The operators torch's kernels do not device-check (`device_check: NoCheck`, native_functions.yaml).");
  m.def("register_profiler", &profiling::register_profiler,
        "Register the device's activity profiler with torch.profiler (PrivateUse1; once per process).");
  m.def("default_generator", [](int d) { return default_generator(static_cast<DeviceIndex>(d)); });
}
