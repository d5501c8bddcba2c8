// A Backend that hands every op to another one: the base of wrappers that
// change one thing (a test's fake device, a benchmark's timers) and forward
// the rest. The inner backend owns every tensor.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "longctx/core/backend.h"

namespace longctx {

class ForwardingBackend : public Backend {
 public:
  explicit ForwardingBackend(Backend& inner) : inner_(inner) {}
  std::string name() const override { return inner_.name(); }
  bool host_memory() const override { return inner_.host_memory(); }
  std::unique_ptr<BackendTensor> alloc(std::vector<int64_t> shape, DType dtype = DType::kF32) override {
    return inner_.alloc(std::move(shape), dtype);
  }
  void upload(const TensorView& src, BackendTensor& dst) override { inner_.upload(src, dst); }
  void download(const BackendTensor& src, const MutableTensorView& dst) override { inner_.download(src, dst); }
  std::unique_ptr<BackendTensor> load_weight(const HostWeight& host) override { return inner_.load_weight(host); }
  void matmul(const BackendTensor& x, const BackendTensor& w, const BackendTensor* bias, BackendTensor& y) override {
    inner_.matmul(x, w, bias, y);
  }
  void rms_norm(const BackendTensor& x, const BackendTensor& weight, float eps, BackendTensor& y) override {
    inner_.rms_norm(x, weight, eps, y);
  }
  void rope(BackendTensor& x, int64_t first_pos, const RopeParams& params) override {
    inner_.rope(x, first_pos, params);
  }
  void swiglu(const BackendTensor& gate, const BackendTensor& up, BackendTensor& out) override {
    inner_.swiglu(gate, up, out);
  }
  void add(const BackendTensor& a, const BackendTensor& b, BackendTensor& out) override { inner_.add(a, b, out); }
  void embed(const BackendTensor& table, std::span<const int32_t> tokens, BackendTensor& out) override {
    inner_.embed(table, tokens, out);
  }
  void synchronize() override { inner_.synchronize(); }
  DeviceAttention* device_attention() override { return inner_.device_attention(); }

 protected:
  Backend& inner() { return inner_; }

 private:
  Backend& inner_;
};

}  // namespace longctx
