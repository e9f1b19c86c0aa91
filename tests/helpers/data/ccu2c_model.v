// Behavioural model of the ECP5 CCU2C for simulation tests only, written from Lattice's ECP5
// family data sheet (FPGA-DS-02012, the PFU's carry-chain mode): two bits, each a 4-input
// LUT F (table INITn, entry A + 2B + 4C + 8D) whose output is the propagate; the generate is
// the same table's first four entries (inputs A, B); the sum is F ^ carry-in and the carry out
// F ? carry-in : generate. INJECT1_n = "YES" (a constant 0 into the chain) is not modelled:
// onnx2fpga sets "NO".
module CCU2C (
    input CIN, A0, B0, C0, D0, A1, B1, C1, D1,
    output S0, S1, COUT
);
    parameter [15:0] INIT0 = 16'h0000;
    parameter [15:0] INIT1 = 16'h0000;
    parameter INJECT1_0 = "NO";
    parameter INJECT1_1 = "NO";
    wire f0 = INIT0[{D0, C0, B0, A0}];
    wire g0 = INIT0[{2'b00, B0, A0}];
    wire c1 = f0 ? CIN : g0;
    wire f1 = INIT1[{D1, C1, B1, A1}];
    wire g1 = INIT1[{2'b00, B1, A1}];
    assign S0 = f0 ^ CIN;
    assign S1 = f1 ^ c1;
    assign COUT = f1 ? c1 : g1;
endmodule
