#include "textflag.h"

// func cpuHasF16C() bool
TEXT ·cpuHasF16C(SB), NOSPLIT, $0-1
	MOVL $1, AX
	XORL CX, CX
	CPUID
	// F16C (bit 29), AVX (bit 28) and OSXSAVE (bit 27) of ECX.
	MOVL CX, DX
	ANDL $0x38000000, DX
	CMPL DX, $0x38000000
	JNE  no
	// The operating system saves the SSE and AVX registers (XCR0 bits 1, 2).
	XORL CX, CX
	XGETBV
	ANDL $6, AX
	CMPL AX, $6
	JNE  no
	MOVB $1, ret+0(FP)
	RET
no:
	MOVB $0, ret+0(FP)
	RET

// func encodeF16C(dst []uint16, src []float32)
TEXT ·encodeF16C(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	SHRQ $3, CX
	JZ   done
loop:
	VMOVUPS   (SI), Y0
	VCVTPS2PH $0, Y0, X1
	VMOVDQU   X1, (DI)
	ADDQ      $32, SI
	ADDQ      $16, DI
	DECQ      CX
	JNZ       loop
	VZEROUPPER
done:
	RET

// func decodeF16C(dst []float32, src []uint16)
TEXT ·decodeF16C(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	SHRQ $3, CX
	JZ   done
loop:
	VCVTPH2PS (SI), Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       loop
	VZEROUPPER
done:
	RET

// func cpuHasAVX2() bool
TEXT ·cpuHasAVX2(SB), NOSPLIT, $0-1
	MOVL $1, AX
	XORL CX, CX
	CPUID
	// AVX (bit 28) and OSXSAVE (bit 27) of ECX.
	ANDL $0x18000000, CX
	CMPL CX, $0x18000000
	JNE  no2
	XORL CX, CX
	XGETBV
	ANDL $6, AX
	CMPL AX, $6
	JNE  no2
	MOVL $7, AX
	XORL CX, CX
	CPUID
	// AVX2: bit 5 of EBX.
	ANDL $0x20, BX
	JZ   no2
	MOVB $1, ret+0(FP)
	RET
no2:
	MOVB $0, ret+0(FP)
	RET

// func encodeBF16AVX2(dst []uint16, src []float32)
// Rounds to nearest, ties to even; a nan keeps its top bits and is quieted.
TEXT ·encodeBF16AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	SHRQ $3, CX
	JZ   bdone
	MOVL $0x7fffffff, AX
	VMOVD AX, X10
	VPBROADCASTD X10, Y10 // magnitude mask
	MOVL $0x7f800000, AX
	VMOVD AX, X11
	VPBROADCASTD X11, Y11 // inf
	MOVL $0x7fff, AX
	VMOVD AX, X12
	VPBROADCASTD X12, Y12 // rounding bias
	MOVL $1, AX
	VMOVD AX, X13
	VPBROADCASTD X13, Y13 // ones
	MOVL $0x40, AX
	VMOVD AX, X14
	VPBROADCASTD X14, Y14 // quiet bit of a bfloat16 nan
bloop:
	VMOVDQU      (SI), Y0
	VPAND        Y10, Y0, Y1
	VPCMPGTD     Y11, Y1, Y2   // nan lanes
	VPSRLD       $16, Y0, Y4
	VPAND        Y13, Y4, Y5   // the lowest kept bit, for ties to even
	VPADDD       Y12, Y0, Y6
	VPADDD       Y5, Y6, Y6
	VPSRLD       $16, Y6, Y6
	VPOR         Y14, Y4, Y7   // a quieted nan
	VPBLENDVB    Y2, Y7, Y6, Y8
	VEXTRACTI128 $1, Y8, X9
	VPACKUSDW    X9, X8, X15
	VMOVDQU      X15, (DI)
	ADDQ         $32, SI
	ADDQ         $16, DI
	DECQ         CX
	JNZ          bloop
	VZEROUPPER
bdone:
	RET

// func decodeBF16AVX2(dst []float32, src []uint16)
TEXT ·decodeBF16AVX2(SB), NOSPLIT, $0-48
	MOVQ dst_base+0(FP), DI
	MOVQ src_base+24(FP), SI
	MOVQ src_len+32(FP), CX
	SHRQ $3, CX
	JZ   ddone
dloop:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVDQU   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       dloop
	VZEROUPPER
ddone:
	RET
