// The verdict a correct backend must get on a case: SKIP, naming what is
// missing, where it does not declare what the case needs (a format version 2
// addition, or the dtype: onednn has bfloat16 only where oneDNN has a bf16
// matmul for the CPU); PASS everywhere else.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "attnbench/backend.hpp"
#include "verify/verifier.hpp"

namespace attn::testing {

inline void expect_pass_unless_undeclared(const CaseOutcome& o, const Capabilities& declared, const Problem& p) {
  if (p.features() & ~declared.features) {
    EXPECT_EQ(o.comparison.verdict, Verdict::skip) << o.backend << " " << o.fixture;
    EXPECT_NE(o.comparison.reason.find("(format version 2)"), std::string::npos) << o.comparison.reason;
  } else if (!(declared.dtypes & dtype_bit(p.dtype))) {
    EXPECT_EQ(o.comparison.verdict, Verdict::skip) << o.backend << " " << o.fixture;
    EXPECT_NE(o.comparison.reason.find(std::string(dtype_name(p.dtype))), std::string::npos) << o.comparison.reason;
  } else {
    EXPECT_EQ(o.comparison.verdict, Verdict::pass) << o.backend << " " << o.fixture << ": " << o.comparison.reason;
  }
}

}  // namespace attn::testing
