package checkpoint

import (
	"cmp"
	"slices"
)

// complete returns an *IncompleteError if the tensor was saved as slices
// that do not cover it, nil otherwise.
func (e Entry) complete(prefix string) error {
	if e.slices == nil {
		return nil
	}
	block := uncovered(e.Shape, e.slices)
	if block == nil {
		return nil
	}
	err := &IncompleteError{Prefix: prefix, Name: e.Name, Shape: e.Shape}
	for _, x := range block {
		err.Missing = append(err.Missing, [2]int64{x.start, x.end})
	}
	err.rows, err.byRows = rowsOnly(e.Shape, e.slices)
	return err
}

// uncovered returns the first block, in row-major order, that no slice
// covers, or nil if the slices cover the whole shape. The blocks are the
// cells of the grid that cuts each dimension at every slice's boundaries,
// so that each slice covers a cell whole or not at all.
func uncovered(shape []int64, sl [][]extent) []extent {
	cuts := make([][]int64, len(shape))
	for d, n := range shape {
		cuts[d] = []int64{0, n}
		for _, s := range sl {
			cuts[d] = append(cuts[d], s[d].start, s[d].end)
		}
		slices.Sort(cuts[d])
		cuts[d] = slices.Compact(cuts[d])
		if n == 0 {
			return nil
		}
	}
	cell := make([]int, len(shape)) // the index of the cell in each dimension
	for {
		block := make([]extent, len(shape))
		for d, c := range cell {
			block[d] = extent{cuts[d][c], cuts[d][c+1]}
		}
		if !slices.ContainsFunc(sl, func(s []extent) bool { return contains(s, block) }) {
			return block
		}
		d := len(cell) - 1
		for ; d >= 0; d-- {
			if cell[d]++; cell[d] < len(cuts[d])-1 {
				break
			}
			cell[d] = 0
		}
		if d < 0 {
			return nil
		}
	}
}

// contains reports whether slice s holds block b.
func contains(s, b []extent) bool {
	for d := range s {
		if b[d].start < s[d].start || b[d].end > s[d].end {
			return false
		}
	}
	return true
}

// rowsOnly returns the ranges of rows the slices cover, merged and sorted,
// if every slice spans every dimension but the first.
func rowsOnly(shape []int64, sl [][]extent) ([][2]int64, bool) {
	if len(shape) == 0 {
		return nil, false
	}
	var rows [][2]int64
	for _, s := range sl {
		for d := 1; d < len(shape); d++ {
			if s[d] != (extent{0, shape[d]}) {
				return nil, false
			}
		}
		if s[0].end > s[0].start {
			rows = append(rows, [2]int64{s[0].start, s[0].end})
		}
	}
	slices.SortFunc(rows, func(a, b [2]int64) int { return cmp.Compare(a[0], b[0]) })
	var merged [][2]int64
	for _, r := range rows {
		if n := len(merged); n > 0 && r[0] <= merged[n-1][1] {
			merged[n-1][1] = max(merged[n-1][1], r[1])
			continue
		}
		merged = append(merged, r)
	}
	return merged, true
}
