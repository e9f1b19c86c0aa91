// Behavioural model of the ECP5 MULT18X18D for simulation tests only, written from Lattice's
// sysDSP usage guide (TN1267): 18x18 multiply with optional A, B input registers, pipeline
// and output registers, each on CLK0 with enable CE0 and synchronous reset RST0 when its
// *_CLK parameter is "CLK0"; SIGNEDA/SIGNEDB say whether A/B are two's complement. Only the
// features onnx2fpga instantiates are modelled (no cascades, no C input, no shift chains).
module MULT18X18D (
    input A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0,
    input B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0,
    input C17, C16, C15, C14, C13, C12, C11, C10, C9, C8, C7, C6, C5, C4, C3, C2, C1, C0,
    input SIGNEDA, SIGNEDB, SOURCEA, SOURCEB,
    input CLK3, CLK2, CLK1, CLK0, CE3, CE2, CE1, CE0, RST3, RST2, RST1, RST0,
    input SRIA17, SRIA16, SRIA15, SRIA14, SRIA13, SRIA12, SRIA11, SRIA10, SRIA9,
    input SRIA8, SRIA7, SRIA6, SRIA5, SRIA4, SRIA3, SRIA2, SRIA1, SRIA0,
    input SRIB17, SRIB16, SRIB15, SRIB14, SRIB13, SRIB12, SRIB11, SRIB10, SRIB9,
    input SRIB8, SRIB7, SRIB6, SRIB5, SRIB4, SRIB3, SRIB2, SRIB1, SRIB0,
    output P35, P34, P33, P32, P31, P30, P29, P28, P27, P26, P25, P24, P23, P22, P21, P20,
    output P19, P18, P17, P16, P15, P14, P13, P12, P11, P10, P9, P8, P7, P6, P5, P4, P3,
    output P2, P1, P0
);
    parameter REG_INPUTA_CLK = "NONE";
    parameter REG_INPUTA_CE = "CE0";
    parameter REG_INPUTA_RST = "RST0";
    parameter REG_INPUTB_CLK = "NONE";
    parameter REG_INPUTB_CE = "CE0";
    parameter REG_INPUTB_RST = "RST0";
    parameter REG_INPUTC_CLK = "NONE";
    parameter REG_PIPELINE_CLK = "NONE";
    parameter REG_OUTPUT_CLK = "NONE";
    parameter REG_OUTPUT_CE = "CE0";
    parameter REG_OUTPUT_RST = "RST0";
    parameter GSR = "ENABLED";
    parameter RESETMODE = "SYNC";
    parameter SOURCEB_MODE = "B_SHIFT";
    parameter MULT_BYPASS = "DISABLED";
    parameter CAS_MATCH_REG = "FALSE";
    parameter HIGHSPEED_CLK = "NONE";
    parameter CLK0_DIV = "ENABLED";
    parameter CLK1_DIV = "ENABLED";
    parameter CLK2_DIV = "ENABLED";
    parameter CLK3_DIV = "ENABLED";

    wire [17:0] a = {A17, A16, A15, A14, A13, A12, A11, A10, A9, A8, A7, A6, A5, A4, A3, A2, A1, A0};
    wire [17:0] b = {B17, B16, B15, B14, B13, B12, B11, B10, B9, B8, B7, B6, B5, B4, B3, B2, B1, B0};
    reg [17:0] a_r = 0, b_r = 0;
    reg sa_r = 0, sb_r = 0;
    reg [35:0] p_r = 0, m_r = 0;
    wire [17:0] a_m = REG_INPUTA_CLK == "CLK0" ? a_r : a;
    wire [17:0] b_m = REG_INPUTB_CLK == "CLK0" ? b_r : b;
    wire sa_m = REG_INPUTA_CLK == "CLK0" ? sa_r : SIGNEDA;
    wire sb_m = REG_INPUTB_CLK == "CLK0" ? sb_r : SIGNEDB;
    wire signed [36:0] a_x = {{19{sa_m & a_m[17]}}, a_m};
    wire signed [36:0] b_x = {{19{sb_m & b_m[17]}}, b_m};
    wire signed [73:0] full = a_x * b_x;
    wire [35:0] prod = full[35:0];
    wire [35:0] piped = REG_PIPELINE_CLK == "CLK0" ? m_r : prod;
    assign {P35, P34, P33, P32, P31, P30, P29, P28, P27, P26, P25, P24, P23, P22, P21, P20,
            P19, P18, P17, P16, P15, P14, P13, P12, P11, P10, P9, P8, P7, P6, P5, P4, P3,
            P2, P1, P0} = REG_OUTPUT_CLK == "CLK0" ? p_r : piped;
    always @(posedge CLK0) begin
        if (RST0) begin
            a_r <= 0; b_r <= 0; sa_r <= 0; sb_r <= 0; m_r <= 0; p_r <= 0;
        end else if (CE0) begin
            a_r <= a; b_r <= b; sa_r <= SIGNEDA; sb_r <= SIGNEDB; m_r <= prod; p_r <= piped;
        end
    end
endmodule
