// Byte sizes as the CLI spells them (../shared/CLI.md): "6GB" = 6·10⁹, "6GiB" = 6·2³⁰, also
// MB, MiB, KB, KiB, TB, TiB and plain bytes; decimals allowed ("1.5GB"); case-insensitive units.
#pragma once
#include <cstdint>
#include <string>
#include <string_view>

#include "support/status.h"

namespace memc {

Expected<int64_t> parse_size(std::string_view text);
// "6.00 GB (6,000,000,000 bytes)"-style text for messages: decimal units, 3 significant digits.
std::string format_size(int64_t bytes);

}  // namespace memc
