// How verification results are shown: a fmt table on the terminal, JSON for
// reports and JUnit XML for CI systems.
#pragma once

#include <cstdio>
#include <filesystem>
#include <string>

#include "verify/verifier.hpp"

namespace attn {

void print_outcome_header(std::FILE* out);
void print_outcome(std::FILE* out, const CaseOutcome& outcome);
// Totals per backend and, for every failure, the command that reproduces it.
void print_summary(std::FILE* out, const VerifySummary& summary, const std::string& attn_command);

void write_json(const VerifySummary& summary, const std::filesystem::path& path);
void write_junit(const VerifySummary& summary, const std::filesystem::path& path);

}  // namespace attn
