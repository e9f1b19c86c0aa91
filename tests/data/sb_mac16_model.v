// Behavioural model of the iCE40 SB_MAC16 for simulation tests only, written from Lattice's
// iCE40 DSP function usage guide (TN1295): the 16 x 16 multiplier with the optional A and B
// input registers and the second 16 x 16 pipeline register, on CLK with enable CE (NEG_TRIGGER
// 0: the rising edge); A_SIGNED / B_SIGNED say whether A / B are two's complement; an output
// select of 3 on both halves puts the 32-bit product on O. Only this configuration, the one
// onnx2fpga instantiates, is modelled: the accumulators, the 8 x 8 mode, the C and D inputs,
// holds and resets are not (a simulation with other settings stops at once).
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

    initial begin
        if (NEG_TRIGGER || MODE_8x8 || TOPOUTPUT_SELECT != 2'b11 || BOTOUTPUT_SELECT != 2'b11
            || PIPELINE_16x16_MULT_REG1) begin
            $display("SB_MAC16 model: unsupported configuration");
            $finish;
        end
    end

    reg [15:0] a_r = 0, b_r = 0;
    reg [31:0] p_r = 0;
    wire [15:0] a_m = A_REG ? a_r : A;
    wire [15:0] b_m = B_REG ? b_r : B;
    wire signed [16:0] a_x = {A_SIGNED & a_m[15], a_m};
    wire signed [16:0] b_x = {B_SIGNED & b_m[15], b_m};
    wire signed [33:0] p_full = a_x * b_x;
    wire [31:0] p = p_full[31:0];
    always @(posedge CLK) begin
        if (CE) begin
            a_r <= A;
            b_r <= B;
            p_r <= p;
        end
    end
    assign O = PIPELINE_16x16_MULT_REG2 ? p_r : p;
    assign CO = 1'b0;
    assign ACCUMCO = 1'b0;
    assign SIGNEXTOUT = 1'b0;
endmodule
