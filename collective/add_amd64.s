#include "textflag.h"

// func addFloat32AVX2(dst, a, b []float32)
// Sets dst[i] = a[i] + b[i] for the first len(dst)/8*8 elements.
TEXT ·addFloat32AVX2(SB), NOSPLIT, $0-72
	MOVQ dst_base+0(FP), DI
	MOVQ a_base+24(FP), SI
	MOVQ b_base+48(FP), DX
	MOVQ dst_len+8(FP), CX
	MOVQ CX, BX
	SHRQ $5, BX
	JZ   tail
loop32:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS  (DX), Y0, Y0
	VADDPS  32(DX), Y1, Y1
	VADDPS  64(DX), Y2, Y2
	VADDPS  96(DX), Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	ADDQ    $128, SI
	ADDQ    $128, DX
	ADDQ    $128, DI
	DECQ    BX
	JNZ     loop32
tail:
	ANDQ $31, CX
	SHRQ $3, CX
	JZ   done
loop8:
	VMOVUPS (SI), Y0
	VADDPS  (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	DECQ    CX
	JNZ     loop8
done:
	VZEROUPPER
	RET

// func addFloat32TwoAVX2(dst, dst2, a, b []float32)
// Sets dst[i] and dst2[i] to a[i] + b[i] for the first len(dst)/8*8
// elements. dst2 is 32-byte aligned and written with non-temporal stores,
// fenced before the return: memory another process reads later.
TEXT ·addFloat32TwoAVX2(SB), NOSPLIT, $0-96
	MOVQ dst_base+0(FP), DI
	MOVQ dst2_base+24(FP), R8
	MOVQ a_base+48(FP), SI
	MOVQ b_base+72(FP), DX
	MOVQ dst_len+8(FP), CX
	MOVQ CX, BX
	SHRQ $5, BX
	JZ   tail2
loop32two:
	VMOVUPS (SI), Y0
	VMOVUPS 32(SI), Y1
	VMOVUPS 64(SI), Y2
	VMOVUPS 96(SI), Y3
	VADDPS  (DX), Y0, Y0
	VADDPS  32(DX), Y1, Y1
	VADDPS  64(DX), Y2, Y2
	VADDPS  96(DX), Y3, Y3
	VMOVUPS Y0, (DI)
	VMOVUPS Y1, 32(DI)
	VMOVUPS Y2, 64(DI)
	VMOVUPS Y3, 96(DI)
	VMOVNTPS Y0, (R8)
	VMOVNTPS Y1, 32(R8)
	VMOVNTPS Y2, 64(R8)
	VMOVNTPS Y3, 96(R8)
	ADDQ    $128, SI
	ADDQ    $128, DX
	ADDQ    $128, DI
	ADDQ    $128, R8
	DECQ    BX
	JNZ     loop32two
tail2:
	ANDQ $31, CX
	SHRQ $3, CX
	JZ   done2
loop8two:
	VMOVUPS (SI), Y0
	VADDPS  (DX), Y0, Y0
	VMOVUPS Y0, (DI)
	VMOVNTPS Y0, (R8)
	ADDQ    $32, SI
	ADDQ    $32, DX
	ADDQ    $32, DI
	ADDQ    $32, R8
	DECQ    CX
	JNZ     loop8two
done2:
	SFENCE
	VZEROUPPER
	RET
