// Saving again under a tag that already holds a complete checkpoint (a fixed tag such as "best")
// must not lose it if the new save fails or dies. The new save is written beside it, into
// `<tag>.replacing`, and swapped in only once it is complete (its manifest written):
//
//   rename <tag> -> <tag>.replaced, rename <tag>.replacing -> <tag>, fsync <save_dir>,
//   remove <tag>.replaced
//
// At every instant one complete copy of the tag can be found: a save dying before the swap leaves
// <tag> as it was; one dying between the two renames leaves <tag> missing and the complete new
// save in <tag>.replacing, which the loader reads (tag_dir_to_read) and the next save of the tag
// moves into place (finish_interrupted_replacement). Files in <tag> that the save does not write
// (a user's notes, a tokenizer) move into the new copy, as an in-place re-save would keep them.
#pragma once
#include <string>

#include "checkpoint/file_system.h"

namespace deepspeed {
namespace checkpoint {

// The two folder names a replacement of `tag_dir` (<save_dir>/<tag>) uses.
std::string replacing_dir(const std::string& tag_dir);
std::string replaced_dir(const std::string& tag_dir);
// Tags ending in a suffix these use would collide with another tag's replacement.
bool is_replacement_name(const std::string& tag);

// Whether a save of `tag_dir` must go through a replacement: the tag holds a manifest.
bool holds_complete_checkpoint(FileSystem& fs, const std::string& tag_dir);

// Before a save of the tag (one rank): completes a swap a dying save left half done, then
// removes what an interrupted replacement left (a partial .replacing, an old .replaced).
void finish_interrupted_replacement(FileSystem& fs, const std::string& tag_dir);

// Swaps the complete `replacing_dir(tag_dir)` in for `tag_dir` (one rank), as above; if the
// second rename fails the first is undone. The old copy's removal is best effort: a failure
// there leaves it for the next save of the tag.
void swap_in_replacement(FileSystem& fs, const std::string& tag_dir);

// The folder a load of `tag_dir` reads: tag_dir itself, or, when a save died between the two
// renames of its swap, the complete replacement beside it.
std::string tag_dir_to_read(FileSystem& fs, const std::string& tag_dir);

// rm -r of a checkpoint folder (with any folder a user put inside). Returns false when nothing
// was there.
bool remove_checkpoint_folder(FileSystem& fs, const std::string& dir);

}  // namespace checkpoint
}  // namespace deepspeed
