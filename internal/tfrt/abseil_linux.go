package tfrt

// #cgo LDFLAGS: -ldl
// #define _GNU_SOURCE
// #include <dlfcn.h>
// #include <link.h>
// #include <stdint.h>
// #include <stdlib.h>
// #include <string.h>
// #include "tensorflow/c/c_api.h"
//
// // tfrt_library locates the library that defines TF_Version: its path
// // and the address it is loaded at.
// static const char *tfrt_library(uintptr_t *base) {
// 	Dl_info info;
// 	if (!dladdr((void *)TF_Version, &info) || info.dli_fname == NULL) return NULL;
// 	*base = (uintptr_t)info.dli_fbase;
// 	return info.dli_fname;
// }
//
// struct tfrt_found { const char *want, *path; uintptr_t base; };
//
// static int tfrt_match(struct dl_phdr_info *info, size_t size, void *data) {
// 	struct tfrt_found *f = data;
// 	if (info->dlpi_name == NULL || strstr(info->dlpi_name, f->want) == NULL) return 0;
// 	for (int i = 0; i < info->dlpi_phnum; i++) {
// 		if (info->dlpi_phdr[i].p_type == PT_LOAD) {
// 			f->path = info->dlpi_name;
// 			f->base = info->dlpi_addr + (info->dlpi_phdr[i].p_vaddr & ~(info->dlpi_phdr[i].p_align - 1));
// 			return 1;
// 		}
// 	}
// 	return 0;
// }
//
// // tfrt_loaded locates the loaded library whose path contains want, as
// // tfrt_library does.
// static const char *tfrt_loaded(const char *want, uintptr_t *base) {
// 	struct tfrt_found f = {want, NULL, 0};
// 	dl_iterate_phdr(tfrt_match, &f);
// 	*base = f.base;
// 	return f.path;
// }
//
// static void tfrt_store_int(uintptr_t addr, int v) {
// 	__atomic_store_n((int *)addr, v, __ATOMIC_RELAXED);
// }
import "C"

import (
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"syscall"
	"unsafe"
)

// abseilMinLogLevel is the name, in the library's symbol table, of the
// level below which Abseil's LOG drops a message (absl::MinLogLevel). The
// "lts_" part names the Abseil release, which the pattern leaves open.
var abseilMinLogLevel = []byte("12_GLOBAL__N_113min_log_levelE")

// tslMinLogLevel is the name of the level TensorFlow's own logger keeps
// from TF_CPP_MIN_LOG_LEVEL, read at its first log (a static of
// tsl::internal::LogMessage's destructor); each TensorFlow library has one.
var tslMinLogLevel = []byte("10LogMessageD1EvE13min_log_level")

// frameworkLibrary names TensorFlow's framework library, which has a
// logger of its own.
const frameworkLibrary = "libtensorflow_framework.so"

// quietTensorFlow gives TensorFlow's loggers the level TF_CPP_MIN_LOG_LEVEL
// asks, wherever they may have read another.
//
// TensorFlow's own logger (tsl) reads that variable once, at its first
// log. That is usually a program's first session, after this package's
// init set the variable; but on a CPU for which TensorFlow turns oneDNN
// on (AVX512-VNNI, AVX512-BF16, AVX-VNNI or AMX), the framework library
// logs "oneDNN custom operations are on" from a static initialiser, while
// it loads, before any Go code runs, and its level is then 0 (log
// everything) for the process. TensorFlow 2.18 also logs a few lines
// through a copy of Abseil's logging that it keeps private: "MLIR V1
// optimization pass is not enabled" at a process's first session run,
// preceded by Abseil's "WARNING: All log messages before
// absl::InitializeLog() is called are written to STDERR"; that copy reads
// neither TF_CPP_MIN_LOG_LEVEL nor the environment, and exports no
// function to set its level.
//
// Each of these levels is a 4-byte variable that the libraries' symbol
// tables (.symtab, which the TensorFlow wheel keeps) name. So
// quietTensorFlow finds each as a debugger would, checks it is a writable
// 4-byte object, and stores the level there, before any session exists.
// Where any of that fails (a stripped or different build), that logger
// keeps its level and logs its INFO lines: the error says why.
func quietTensorFlow() error {
	level, ok := minLogLevel()
	if !ok || level == 0 {
		return nil
	}
	var base C.uintptr_t
	capi := C.tfrt_library(&base)
	if capi == nil {
		return errors.New("dladdr cannot locate the library of TF_Version")
	}
	err := storeLevel(C.GoString(capi), base, level, abseilMinLogLevel, tslMinLogLevel)
	cwant := C.CString(frameworkLibrary)
	defer C.free(unsafe.Pointer(cwant))
	if fw := C.tfrt_loaded(cwant, &base); fw != nil {
		err = errors.Join(err, storeLevel(C.GoString(fw), base, level, tslMinLogLevel))
	}
	return err
}

// storeLevel stores level in each variable named like one of names of the
// library at path, loaded at base, reading its symbol table once.
func storeLevel(path string, base C.uintptr_t, level int, names ...[]byte) error {
	offs, err := symbolOffsets(path, names)
	for _, off := range offs {
		C.tfrt_store_int(base+C.uintptr_t(off), C.int(level))
	}
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// minLogLevel reads TF_CPP_MIN_LOG_LEVEL from the C environment, where
// this package's init has put its default, as TensorFlow parses it:
// an integer, capped at 3 (drop ERROR too); anything else is 0.
func minLogLevel() (int, bool) {
	cname := C.CString("TF_CPP_MIN_LOG_LEVEL")
	defer C.free(unsafe.Pointer(cname))
	v := C.getenv(cname)
	if v == nil {
		return 0, false
	}
	n, err := strconv.Atoi(C.GoString(v))
	if err != nil || n < 0 {
		return 0, true
	}
	return min(n, 3), true
}

// symbolOffsets returns the load offsets of the writable 4-byte local
// objects whose names in path's .symtab contain one of names, in one pass
// over the table, and an error naming each of names that no such object
// matches. The symbol and string tables
// are read through a read-only mapping of the file, so only their pages
// are read.
func symbolOffsets(path string, names [][]byte) ([]uint64, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, err
	}
	symtab, strtab := ef.Section(".symtab"), ef.Section(".strtab")
	if symtab == nil || strtab == nil || ef.Class != elf.ELFCLASS64 || ef.ByteOrder != binary.LittleEndian {
		return nil, errors.New("no 64-bit little-endian symbol table")
	}
	fi, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if fi.Size() > math.MaxInt || symtab.Offset+symtab.Size > uint64(fi.Size()) || strtab.Offset+strtab.Size > uint64(fi.Size()) {
		return nil, errors.New("symbol table past the end of the file")
	}
	data, err := syscall.Mmap(int(f.Fd()), 0, int(fi.Size()), syscall.PROT_READ, syscall.MAP_SHARED)
	if err != nil {
		return nil, err
	}
	defer func() { _ = syscall.Munmap(data) }()
	return matchSymbols(ef, data[symtab.Offset:symtab.Offset+symtab.Size], data[strtab.Offset:strtab.Offset+strtab.Size], names)
}

// matchSymbols is symbolOffsets over ef's symbol and string tables.
func matchSymbols(ef *elf.File, syms, strs []byte, names [][]byte) ([]uint64, error) {
	var offs []uint64
	var errs []error
	found := make([]bool, len(names))
	for i := 0; i+elf.Sym64Size <= len(syms) && len(offs)+len(errs) < len(names); i += elf.Sym64Size {
		e := syms[i : i+elf.Sym64Size]
		info, shndx := e[4], binary.LittleEndian.Uint16(e[6:])
		if binary.LittleEndian.Uint64(e[16:]) != 4 || elf.ST_TYPE(info) != elf.STT_OBJECT ||
			elf.ST_BIND(info) != elf.STB_LOCAL || int(shndx) >= len(ef.Sections) {
			continue
		}
		at := int(binary.LittleEndian.Uint32(e))
		if at >= len(strs) {
			continue
		}
		sym := strs[at:]
		if end := bytes.IndexByte(sym, 0); end >= 0 {
			sym = sym[:end]
		}
		k := slices.IndexFunc(names, func(n []byte) bool { return bytes.Contains(sym, n) })
		if k < 0 || found[k] {
			continue
		}
		found[k] = true
		if ef.Sections[shndx].Flags&elf.SHF_WRITE == 0 {
			errs = append(errs, fmt.Errorf("symbol %s is not writable", sym))
			continue
		}
		offs = append(offs, binary.LittleEndian.Uint64(e[8:])-loadBase(ef))
	}
	for k, name := range names {
		if !found[k] {
			errs = append(errs, fmt.Errorf("no symbol named like %s", name))
		}
	}
	return offs, errors.Join(errs...)
}

// loadBase is the virtual address of the file's first loadable segment,
// which dladdr's base address corresponds to (0 for a shared library).
func loadBase(ef *elf.File) uint64 {
	for _, p := range ef.Progs {
		if p.Type == elf.PT_LOAD {
			return p.Vaddr &^ (p.Align - 1)
		}
	}
	return 0
}
