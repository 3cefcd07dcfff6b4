/* Point an already-loaded library's calls to one function at another definition.
 *
 * Python loads extension modules with RTLD_NOW, so libmlx binds its cblas_sgemm (every
 * CPU float32 matmul) to the BLAS it was linked with when `import mlx.core` runs. When a
 * program imports mlx.core before mlx_lm_batched (`import mlx.core as mx` then
 * `from mlx_lm_batched import load`: most mlx-lm code), our BLAS and small-row kernel load
 * too late for that binding, and MLX's wheel on Linux links a reference BLAS (a 121-token
 * prefill of SmolLM2's Q4_1 GGUF took 8 s instead of 0.3). The binding is one pointer in
 * the library's global offset table, found by its dynamic relocations; this writes the
 * new address there, as the dynamic linker would have.
 *
 * Linux (ELF, glibc's dl_iterate_phdr) only: elsewhere mlxlmb_rebind reports nothing done.
 */
#define _GNU_SOURCE
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#if defined(__linux__)
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

struct request {
  const char *object; /* how the library's file name starts, e.g. "libmlx." */
  const char *symbol;
  void *replacement;
  int patched;
};

/* Rewrite one slot; a slot inside the object's RELRO segment (read-only once relocated,
 * e.g. a GLOB_DAT entry under -z relro) is made writable for the write, then restored. */
static int write_slot(struct dl_phdr_info *info, uintptr_t slot, void *value) {
  uintptr_t relro_start = 0, relro_end = 0;
  for (int i = 0; i < info->dlpi_phnum; i++)
    if (info->dlpi_phdr[i].p_type == PT_GNU_RELRO) {
      relro_start = info->dlpi_addr + info->dlpi_phdr[i].p_vaddr;
      relro_end = relro_start + info->dlpi_phdr[i].p_memsz;
    }
  const int in_relro = slot >= relro_start && slot < relro_end;
  const uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
  void *page = (void *)(slot & ~(page_size - 1));
  if (in_relro && mprotect(page, page_size, PROT_READ | PROT_WRITE) != 0) return 0;
  __atomic_store_n((void **)slot, value, __ATOMIC_SEQ_CST);
  if (in_relro) mprotect(page, page_size, PROT_READ);
  return 1;
}

/* The relocations of one table (DT_JMPREL: PLT calls; DT_RELA: data references, where a
 * library was built with -fno-plt) that name the symbol. */
static int patch_table(struct dl_phdr_info *info, const ElfW(Rela) *table, size_t bytes,
                       const ElfW(Sym) *symbols, const char *strings, const struct request *r) {
  int patched = 0;
  for (size_t i = 0; i < bytes / sizeof(ElfW(Rela)); i++) {
#if __SIZEOF_POINTER__ == 8
    const size_t index = ELF64_R_SYM(table[i].r_info);
#else
    const size_t index = ELF32_R_SYM(table[i].r_info);
#endif
    if (index == 0 || strcmp(strings + symbols[index].st_name, r->symbol) != 0) continue;
    patched += write_slot(info, info->dlpi_addr + table[i].r_offset, r->replacement);
  }
  return patched;
}

static int visit(struct dl_phdr_info *info, size_t size, void *data) {
  (void)size;
  struct request *r = data;
  if (!info->dlpi_name) return 0;
  const char *slash = strrchr(info->dlpi_name, '/');
  const char *base = slash ? slash + 1 : info->dlpi_name;
  if (strncmp(base, r->object, strlen(r->object)) != 0) return 0;
  const ElfW(Dyn) *dynamic = NULL;
  for (int i = 0; i < info->dlpi_phnum; i++)
    if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
      dynamic = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
  if (!dynamic) return 0;
  const ElfW(Rela) *jmprel = NULL, *rela = NULL;
  const ElfW(Sym) *symbols = NULL;
  const char *strings = NULL;
  size_t jmprel_bytes = 0, rela_bytes = 0;
  int pltrel = 0;
  for (const ElfW(Dyn) *d = dynamic; d->d_tag != DT_NULL; d++) {
    /* glibc rewrites these to run-time addresses; musl leaves them as offsets. */
    const uintptr_t at = d->d_un.d_ptr < info->dlpi_addr ? d->d_un.d_ptr + info->dlpi_addr
                                                          : d->d_un.d_ptr;
    switch (d->d_tag) {
      case DT_JMPREL: jmprel = (const ElfW(Rela) *)at; break;
      case DT_PLTRELSZ: jmprel_bytes = d->d_un.d_val; break;
      case DT_PLTREL: pltrel = (int)d->d_un.d_val; break;
      case DT_RELA: rela = (const ElfW(Rela) *)at; break;
      case DT_RELASZ: rela_bytes = d->d_un.d_val; break;
      case DT_SYMTAB: symbols = (const ElfW(Sym) *)at; break;
      case DT_STRTAB: strings = (const char *)at; break;
      default: break;
    }
  }
  if (!symbols || !strings) return 0;
  /* x86-64 and aarch64 use RELA throughout; a REL-only table is not handled. */
  if (jmprel && pltrel == DT_RELA)
    r->patched += patch_table(info, jmprel, jmprel_bytes, symbols, strings, r);
  if (rela) r->patched += patch_table(info, rela, rela_bytes, symbols, strings, r);
  return 0;
}
#endif

/* Point every loaded library whose file name starts with `object` at `replacement` for
 * its references to `symbol`. Returns the slots rewritten (0: none found, or not Linux). */
int mlxlmb_rebind(const char *object, const char *symbol, void *replacement) {
#if defined(__linux__)
  struct request r = {object, symbol, replacement, 0};
  dl_iterate_phdr(visit, &r);
  return r.patched;
#else
  (void)object;
  (void)symbol;
  (void)replacement;
  return 0;
#endif
}
