// Plain-text tables and the human-readable units towerctl prints.
//
// Pure functions and a value type; thread-compatible.
#ifndef TOWERPS_CLIENT_TEXT_TABLE_H_
#define TOWERPS_CLIENT_TEXT_TABLE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace towerps::client {

// A table of left-aligned columns separated by two spaces. Every column of
// every row starts at the same byte offset (cells should be ASCII for that to
// hold on screen too). Rows shorter than the header are padded with empty
// cells; trailing spaces are trimmed.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);

  void AddRow(std::vector<std::string> cells);

  // The header and the rows, one line each, every line prefixed by `indent`
  // and ended by '\n'.
  std::string Render(const std::string& indent = "") const;

 private:
  std::vector<std::vector<std::string>> rows_;  // rows_[0] is the header.
};

// 0 B, 512 B, 1.5 KiB, 12.0 MiB, 1.20 GiB (binary units).
std::string HumanBytes(int64_t bytes);

// 12.3s, 4m05s, 1h02m, 2d03h; "-" for negative values.
std::string HumanDuration(double seconds);

// Local time "YYYY-MM-DD HH:MM:SS" of a Unix time in seconds; "-" for 0.
std::string LocalTime(double unix_seconds);

// `text` cut to at most `max_chars` bytes, ending in "..." when cut; newlines
// become spaces so a cell stays on one line.
std::string Truncate(const std::string& text, size_t max_chars);

}  // namespace towerps::client

#endif  // TOWERPS_CLIENT_TEXT_TABLE_H_
