#include "attnbench/backend.hpp"

#include <fmt/format.h>

#include <chrono>

#include "attnbench/error.hpp"

namespace attn {

double Plan::run_timed() {
  const auto start = std::chrono::steady_clock::now();
  run();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string describe_capabilities(const Capabilities& c) {
  std::string text = c.dtypes ? dtype_names(c.dtypes) : std::string("no dtype");
  text += c.features ? fmt::format("; {}", feature_names(c.features)) : std::string("; no version 2 addition");
  text += c.lse ? "; lse" : "; no lse";
  if (c.backward) text += "; backward";
  if (c.encodings) text += fmt::format("; quantised {}", encoding_names(c.encodings));
  if (!c.uses_threads) text += "; single-threaded";
  if (c.batch_invariant) text += "; batch-invariant";
  if (c.bitwise_relations) text += fmt::format("; bitwise {}", relation_names(c.bitwise_relations));
  if (c.dropout) text += "; dropout";
  return text;
}

std::string_view relation_name(unsigned relation) {
  switch (relation) {
    case kRelationVScale: return "v_scale";
    case kRelationQScale: return "q_scale";
    case kRelationHeadPermutation: return "head_permutation";
    case kRelationKeyPermutation: return "key_permutation";
    case kRelationScoreShift: return "score_shift";
    case kRelationLayout: return "layout";
    case kRelationDoutScale: return "dout_scale";
    default: return "";
  }
}

std::string relation_names(unsigned relations) {
  std::string text;
  for (unsigned bit = 1; bit <= kAllRelations; bit <<= 1) {
    if (!(relations & bit)) continue;
    if (!text.empty()) text += ", ";
    text += relation_name(bit);
  }
  return text;
}

std::unique_ptr<BackwardPlan> Backend::prepare_backward(const Problem&, const BackwardIO&, const RunOptions&) const {
  throw Unsupported(fmt::format("{} has no backward pass", name()));
}

Status Backend::supports_backward(const Problem&) const { return Status::yes(); }

Status backward_defined(const Problem& problem) {
  if (problem.quantised()) {
    return Status::no("a quantised case has no backward pass: the format defines no gradient of codes (version 4)");
  }
  if (problem.paged()) {
    return Status::no("a paged case has no backward pass: the format defines gradients for contiguous and packed K "
                      "and V only");
  }
  return Status::yes();
}

namespace {

Status forward_accepts(const Backend& backend, const Problem& problem) {
  const Capabilities declared = backend.capabilities();
  const unsigned missing = problem.features() & ~declared.features;
  if (missing) return Status::no(fmt::format("does not implement {} (format version 2)", feature_names(missing)));
  if (!(declared.dtypes & dtype_bit(problem.dtype))) {
    return Status::no(fmt::format("does not implement {} (it declares {})", dtype_name(problem.dtype),
                                  declared.dtypes ? dtype_names(declared.dtypes) : std::string("no dtype")));
  }
  if (const unsigned missing_encodings = problem.encodings() & ~declared.encodings) {
    return Status::no(fmt::format("does not implement {} inputs (format version 4)", encoding_names(missing_encodings)));
  }
  return backend.supports(problem);
}

}  // namespace

Status backend_accepts(const Backend& backend, const Problem& problem, Direction direction) {
  Status forward = forward_accepts(backend, problem);
  if (!forward || direction == Direction::forward) return forward;
  if (Status defined = backward_defined(problem); !defined) return defined;
  if (!backend.capabilities().backward) return Status::no("does not implement the backward pass (format version 3)");
  return backend.supports_backward(problem);
}

}  // namespace attn
