"""perf/sass_report.py's SASS walk on a hand-written listing (no GPU, no cutlass)."""

from perf_scripts import load


def _module():
    return load("sass_report.py")


# a loop 0x0100-0x0500 whose body has: a far conditional branch to the masked path (not
# taken), a short conditional skip over a rescale block (taken), an unconditional jump
# over a cold block (followed) and the back edge; 0x2000 holds the masked path
LISTING = """
        /*0000*/                   S2R R0, SR_TID.X ;
        /*0100*/                   LDGSTS.E.BYPASS.128 [R1], desc[UR4][R2.64] ;
        /*0110*/              @P0  BRA 0x2000 ;
        /*0120*/                   IMMA.16832.U8.S8 R4, R8.ROW, R12.COL, RZ ;
        /*0130*/             @!P1  BRA 0x0160 ;
        /*0140*/                   FMUL R5, R5, R6 ;
        /*0150*/                   FMUL R7, R7, R6 ;
        /*0160*/                   HMMA.16816.F32 R16, R20, R24, R16 ;
        /*0170*/                   BRA 0x0190 ;
        /*0180*/                   STL [R1], R2 ;
        /*0190*/                   LOP3.LUT R3, R3, 0xc0c0c0c0, RZ, 0xc0, !PT ;
        /*01a0*/                   ISETP.GE.AND P2, PT, R3, R9, PT ;
""" + "".join(f"        /*{0x1a0 + 16 * k:04x}*/                   NOP ;\n" for k in range(1, 36)) + """
        /*0500*/              @P2  BRA 0x0100 ;
        /*0510*/                   EXIT ;
        /*2000*/                   FSEL R5, R5, -INF , P3 ;
        /*2010*/                   BRA 0x0160 ;
"""


def test_parse_and_opcodes():
    mod = _module()
    ins = mod.parse_sass(LISTING)
    assert ins[0] == (0x0, "S2R R0, SR_TID.X")
    assert mod.opcode("@!P1  IMAD.SHL.U32 R1, R2, 0x4, RZ") == "IMAD"
    assert mod.opcode("LDSM.16.MT88.4 R4, [R2]") == "LDSM"


def test_main_loop_and_fast_path_walk():
    mod = _module()
    ins = mod.parse_sass(LISTING)
    # the masked path's jump back into the body also spans a backward range (no copies)
    assert mod.loops(ins) == [(0x100, 0x500), (0x160, 0x2010)]
    assert mod.main_loop(ins) == (0x100, 0x500)
    fast = mod.fast_path(ins, 0x100, 0x500)
    ops = [mod.opcode(x) for x in fast]
    # the far branch falls through, the rescale block and the cold STL are skipped
    assert ops[:7] == ["LDGSTS", "BRA", "IMMA", "BRA", "HMMA", "BRA", "LOP3"]
    assert "FMUL" not in ops and "STL" not in ops and "FSEL" not in ops
    assert ops[-1] == "BRA" and len(fast) == 7 + 1 + 35 + 1
