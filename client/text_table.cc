#include "client/text_table.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace towerps::client {

TextTable::TextTable(std::vector<std::string> header) { rows_.push_back(std::move(header)); }

void TextTable::AddRow(std::vector<std::string> cells) { rows_.push_back(std::move(cells)); }

std::string TextTable::Render(const std::string& indent) const {
  size_t columns = 0;
  for (const auto& row : rows_) columns = std::max(columns, row.size());
  std::vector<size_t> width(columns, 0);
  for (const auto& row : rows_) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line = indent;
    for (size_t c = 0; c < columns; ++c) {
      const std::string cell = c < row.size() ? row[c] : "";
      line += cell;
      if (c + 1 < columns) line.append(width[c] - cell.size() + 2, ' ');
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out += line;
    out += '\n';
  }
  return out;
}

std::string HumanBytes(int64_t bytes) {
  if (bytes < 1024) return absl::StrFormat("%d B", bytes);
  static const char* const kUnits[] = {"KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int unit = -1;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  // Three significant digits at most: 1.20 GiB, 12.0 MiB, 512 KiB.
  if (v < 10) return absl::StrFormat("%.2f %s", v, kUnits[unit]);
  if (v < 100) return absl::StrFormat("%.1f %s", v, kUnits[unit]);
  return absl::StrFormat("%.0f %s", v, kUnits[unit]);
}

std::string HumanDuration(double seconds) {
  if (seconds < 0 || !std::isfinite(seconds)) return "-";
  if (seconds < 60) return absl::StrFormat("%.1fs", seconds);
  const int64_t s = static_cast<int64_t>(seconds);
  if (s < 3600) return absl::StrFormat("%dm%02ds", s / 60, s % 60);
  if (s < 86400) return absl::StrFormat("%dh%02dm", s / 3600, (s % 3600) / 60);
  return absl::StrFormat("%dd%02dh", s / 86400, (s % 86400) / 3600);
}

std::string LocalTime(double unix_seconds) {
  if (unix_seconds == 0) return "-";
  return absl::FormatTime("%Y-%m-%d %H:%M:%S",
                          absl::FromUnixMicros(static_cast<int64_t>(unix_seconds * 1e6)),
                          absl::LocalTimeZone());
}

std::string Truncate(const std::string& text, size_t max_chars) {
  std::string one_line = text;
  std::replace(one_line.begin(), one_line.end(), '\n', ' ');
  std::replace(one_line.begin(), one_line.end(), '\r', ' ');
  if (one_line.size() <= max_chars) return one_line;
  if (max_chars <= 3) return one_line.substr(0, max_chars);
  return one_line.substr(0, max_chars - 3) + "...";
}

}  // namespace towerps::client
