// The smallest out-of-tree backend: it runs nothing and says so, which makes
// every case SKIP with its reason. Real backends follow impls/README.md.
#include "attnbench/backend.hpp"

namespace attn {

namespace {

class ExampleBackend final : public Backend {
 public:
  std::string_view name() const override { return "example-oot"; }
  std::string_view description() const override { return "out-of-tree registration example (supports nothing)"; }
  Capabilities capabilities() const override { return {}; }
  Status supports(const Problem&) const override { return Status::no("example backend: it implements no attention"); }
  std::unique_ptr<Plan> prepare(const Problem&, const AttentionIO&, const RunOptions&) const override { return nullptr; }
};

}  // namespace

std::unique_ptr<Backend> make_example_oot_backend() { return std::make_unique<ExampleBackend>(); }

}  // namespace attn
