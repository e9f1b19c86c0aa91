// Behavioural model of the iCE40 SB_MAC16 for simulation tests only, written from Lattice's
// iCE40 DSP function usage guide (TN1295): the A and B input registers on CLK with enable CE
// (NEG_TRIGGER 0: the rising edge), then either the 16 x 16 multiplier with its second
// pipeline register (output select 3 on both halves: the 32-bit product on O), or in the
// 8 x 8 mode the top (A[15:8] x B[15:8]) and bottom (A[7:0] x B[7:0]) multipliers with their
// product registers (output select 2: the top product on O[31:16], the bottom on O[15:0]).
// A_SIGNED / B_SIGNED say whether A / B are two's complement (in the 8 x 8 mode, each byte).
// Only these configurations, the ones onnx2fpga instantiates, are modelled: the
// accumulators, the C and D inputs, holds and resets are not (a simulation with other
// settings stops at once).
module SB_MAC16 (
    input CLK, CE,
    input [15:0] C, A, B, D,
    input AHOLD, BHOLD, CHOLD, DHOLD,
    input IRSTTOP, IRSTBOT, ORSTTOP, ORSTBOT,
    input OLOADTOP, OLOADBOT, ADDSUBTOP, ADDSUBBOT,
    input OHOLDTOP, OHOLDBOT, CI, ACCUMCI, SIGNEXTIN,
    output [31:0] O,
    output CO, ACCUMCO, SIGNEXTOUT
);
    parameter [0:0] NEG_TRIGGER = 1'b0;
    parameter [0:0] C_REG = 1'b0;
    parameter [0:0] A_REG = 1'b0;
    parameter [0:0] B_REG = 1'b0;
    parameter [0:0] D_REG = 1'b0;
    parameter [0:0] TOP_8x8_MULT_REG = 1'b0;
    parameter [0:0] BOT_8x8_MULT_REG = 1'b0;
    parameter [0:0] PIPELINE_16x16_MULT_REG1 = 1'b0;
    parameter [0:0] PIPELINE_16x16_MULT_REG2 = 1'b0;
    parameter [1:0] TOPOUTPUT_SELECT = 2'b00;
    parameter [1:0] TOPADDSUB_LOWERINPUT = 2'b00;
    parameter [0:0] TOPADDSUB_UPPERINPUT = 1'b0;
    parameter [1:0] TOPADDSUB_CARRYSELECT = 2'b00;
    parameter [1:0] BOTOUTPUT_SELECT = 2'b00;
    parameter [1:0] BOTADDSUB_LOWERINPUT = 2'b00;
    parameter [0:0] BOTADDSUB_UPPERINPUT = 1'b0;
    parameter [1:0] BOTADDSUB_CARRYSELECT = 2'b00;
    parameter [0:0] MODE_8x8 = 1'b0;
    parameter [0:0] A_SIGNED = 1'b0;
    parameter [0:0] B_SIGNED = 1'b0;

    localparam [1:0] SELECT = MODE_8x8 ? 2'b10 : 2'b11;
    initial begin
        if (NEG_TRIGGER || TOPOUTPUT_SELECT != SELECT || BOTOUTPUT_SELECT != SELECT
            || PIPELINE_16x16_MULT_REG1 || (MODE_8x8 && PIPELINE_16x16_MULT_REG2)) begin
            $display("SB_MAC16 model: unsupported configuration");
            $finish;
        end
    end

    reg [15:0] a_r = 0, b_r = 0;
    reg [31:0] p_r = 0;
    reg [15:0] top_r = 0, bot_r = 0;
    wire [15:0] a_m = A_REG ? a_r : A;
    wire [15:0] b_m = B_REG ? b_r : B;
    // 16 x 16
    wire signed [16:0] a_x = {A_SIGNED & a_m[15], a_m};
    wire signed [16:0] b_x = {B_SIGNED & b_m[15], b_m};
    wire signed [33:0] p_full = a_x * b_x;
    wire [31:0] p = p_full[31:0];
    // 8 x 8
    wire signed [8:0] ah = {A_SIGNED & a_m[15], a_m[15:8]};
    wire signed [8:0] al = {A_SIGNED & a_m[7], a_m[7:0]};
    wire signed [8:0] bh = {B_SIGNED & b_m[15], b_m[15:8]};
    wire signed [8:0] bl = {B_SIGNED & b_m[7], b_m[7:0]};
    wire signed [17:0] top_full = ah * bh;
    wire signed [17:0] bot_full = al * bl;
    wire [15:0] top = top_full[15:0];
    wire [15:0] bot = bot_full[15:0];
    always @(posedge CLK) begin
        if (CE) begin
            a_r <= A;
            b_r <= B;
            p_r <= p;
            top_r <= top;
            bot_r <= bot;
        end
    end
    assign O = MODE_8x8 ? {TOP_8x8_MULT_REG ? top_r : top, BOT_8x8_MULT_REG ? bot_r : bot}
                        : (PIPELINE_16x16_MULT_REG2 ? p_r : p);
    assign CO = 1'b0;
    assign ACCUMCO = 1'b0;
    assign SIGNEXTOUT = 1'b0;
endmodule
