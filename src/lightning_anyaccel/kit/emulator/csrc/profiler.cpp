// The emulated device's activity for torch.profiler: a Kineto activity profiler registered for
// PrivateUse1 (torch::profiler::impl::PrivateUse1ProfilerRegistry), as a native vendor backend
// registers one. While a profiler session records, every operator the device runs through its CPU
// fallback (as a kernel named "kernel: <operator>") and every copy to, from or on the device
// ("Memcpy HtoD", "Memcpy DtoH", "Memcpy DtoD") is kept with its start and end
// and the correlation id of the operator that launched it; Kineto links each one to that operator,
// so torch's report shows the device's own time per operator ("Self NPU", "NPU total") and the
// trace has a row for the device.
//
// The time is the emulator's: how long its CPU kernel or copy took on the host, not what a
// vendor's device would take.

#include <c10/core/Device.h>

#include <chrono>
#include <cstdint>
#include <string>

// torch's registry of PrivateUse1 activity profilers arrived after the package's torch floor: with an
// older torch the device records nothing and torch.profiler records the host only.
#if __has_include(<torch/csrc/profiler/standalone/privateuse1_profiler.h>) && __has_include(<GenericTraceActivity.h>)
#define EMULATOR_PROFILER 1
#endif

#ifdef EMULATOR_PROFILER
#ifndef USE_KINETO
#define USE_KINETO  // torch's wheels are built with Kineto; its headers declare the registry only then
#endif

#include <torch/csrc/profiler/standalone/privateuse1_profiler.h>

#include <GenericTraceActivity.h>
#include <IActivityProfiler.h>
#include <libkineto.h>  // CpuTraceBuffer
#include <output_base.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <set>
#include <vector>
#endif

namespace emulator::profiling {

int64_t now_ns() {  // Kineto's clock: nanoseconds since the epoch
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

#ifndef EMULATOR_PROFILER

bool recording() { return false; }
void record(const std::string&, c10::DeviceIndex, int64_t, int64_t, bool) {}
void register_profiler() {}

#else

namespace {

struct Record {
  std::string name;
  int64_t start_ns;
  int64_t end_ns;
  int64_t correlation;
  c10::DeviceIndex device;
  bool copy;
};

// The records of the session that records now (one at a time, as Kineto runs one trace at a time).
std::mutex g_mutex;
std::vector<Record> g_records;
std::atomic<bool> g_recording{false};
// The correlation ids of the operators running on this thread, innermost last (Kineto pushes and
// pops them around each operator the profiler records, on the thread that runs it).
thread_local std::vector<uint64_t> t_correlation;

const libkineto::TraceSpan& span() {
  static const libkineto::TraceSpan trace(0, 0, "emulated device");
  return trace;
}

class Session : public libkineto::IActivityProfilerSession {
 public:
  void start() override {
    std::lock_guard<std::mutex> lock(g_mutex);
    g_records.clear();
    g_recording = true;
    status_ = libkineto::TraceStatus::RECORDING;
  }

  void stop() override {
    g_recording = false;
    std::lock_guard<std::mutex> lock(g_mutex);
    records_.swap(g_records);
    g_records.clear();
    status_ = libkineto::TraceStatus::PROCESSING;
  }

  std::vector<std::string> errors() override { return {}; }

  void processTrace(libkineto::ActivityLogger& logger) override {
    processTrace(logger, [](int32_t) -> const libkineto::ITraceActivity* { return nullptr; }, 0, 0);
  }

  void processTrace(libkineto::ActivityLogger& logger, libkineto::getLinkedActivityCallback linked,
                    int64_t /*startTime*/, int64_t /*endTime*/) override {
    for (const Record& record : records_) {
      auto type = record.copy ? libkineto::ActivityType::GPU_MEMCPY : libkineto::ActivityType::CONCURRENT_KERNEL;
      libkineto::GenericTraceActivity activity(span(), type, record.name);
      activity.startTime = record.start_ns;
      activity.endTime = record.end_ns;
      activity.id = static_cast<int32_t>(record.correlation);
      activity.device = record.device;
      activity.resource = 0;  // one stream row per device
      activity.linked = record.correlation > 0 ? linked(static_cast<int32_t>(record.correlation)) : nullptr;
      activity.flow.id = static_cast<uint32_t>(record.correlation);
      activity.flow.type = libkineto::kLinkAsyncCpuGpu;
      activity.flow.start = false;
      activity.log(logger);
    }
    records_.clear();
  }

  std::unique_ptr<libkineto::DeviceInfo> getDeviceInfo() override { return nullptr; }
  std::vector<libkineto::ResourceInfo> getResourceInfos() override { return {}; }
  std::unique_ptr<libkineto::CpuTraceBuffer> getTraceBuffer() override { return nullptr; }

  void pushCorrelationId(uint64_t id) override { t_correlation.push_back(id); }
  void popCorrelationId() override {
    if (!t_correlation.empty()) t_correlation.pop_back();
  }

 private:
  std::vector<Record> records_;
};

class ActivityProfiler : public libkineto::IActivityProfiler {
 public:
  const std::string& name() const override { return name_; }

  const std::set<libkineto::ActivityType>& availableActivities() const override { return activities_; }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      const std::set<libkineto::ActivityType>& activity_types, const libkineto::Config& /*config*/) override {
    if (activity_types.count(libkineto::ActivityType::CONCURRENT_KERNEL) == 0) return nullptr;
    return std::make_unique<Session>();
  }

  std::unique_ptr<libkineto::IActivityProfilerSession> configure(
      int64_t /*ts_ms*/, int64_t /*duration_ms*/, const std::set<libkineto::ActivityType>& activity_types,
      const libkineto::Config& config) override {
    return configure(activity_types, config);
  }

 private:
  const std::string name_{"lightning_anyaccel emulated device"};
  const std::set<libkineto::ActivityType> activities_{libkineto::ActivityType::CONCURRENT_KERNEL,
                                                     libkineto::ActivityType::GPU_MEMCPY};
};

}  // namespace

bool recording() { return g_recording.load(std::memory_order_relaxed); }

void record(const std::string& name, c10::DeviceIndex device, int64_t start_ns, int64_t end_ns, bool copy) {
  if (!recording()) return;
  const int64_t correlation = t_correlation.empty() ? 0 : static_cast<int64_t>(t_correlation.back());
  std::lock_guard<std::mutex> lock(g_mutex);
  g_records.push_back(Record{name, start_ns, end_ns, correlation, device, copy});
}

// Register the activity profiler with torch (once per process; the PrivateUse1 device only).
void register_profiler() {
  static std::once_flag once;
  std::call_once(once, [] {
    torch::profiler::impl::PrivateUse1ProfilerRegistry::instance().registerFactory(
        []() -> std::unique_ptr<libkineto::IActivityProfiler> { return std::make_unique<ActivityProfiler>(); });
  });
}

#endif  // EMULATOR_PROFILER

}  // namespace emulator::profiling
